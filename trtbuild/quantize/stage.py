"""quantize stage: FP8 post-training quantization with ModelOpt, an accuracy gate, and the export.

The work (calibration, the gate, the export and its check) is trtbuild/quantize/quantization.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtbuild.core.data.sources import fingerprint
from trtbuild.core.layout import MODEL_HF
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Stage, StageConfig, StageContext, StageResult
from trtbuild.quantize.config import CalibrationConfig, GateConfig, QuantizeConfig
from trtbuild.quantize.export_check import check_export
from trtbuild.quantize.modelopt_nvfp4 import run_nvfp4
from trtbuild.quantize.quantization import run_quantize

__all__ = ["CalibrationConfig", "GateConfig", "QuantizeConfig", "QuantizeStage", "check_export", "run_quantize"]


def _base_dir(recipe: RecipeInfo) -> Path | None:
    return recipe.base_dir


class QuantizeStage(Stage):
    """FP8 post-training quantization (ModelOpt) with a perplexity gate; exported for TensorRT-LLM."""

    name = "quantize"
    config_cls = QuantizeConfig
    depends_on = ("model",)
    libraries = ("nvidia-modelopt", "torch", "transformers", "safetensors")

    def key_material(self, config: StageConfig, recipe: RecipeInfo) -> dict[str, Any]:
        assert isinstance(config, QuantizeConfig)
        base = _base_dir(recipe)
        return {"calibration_data": fingerprint(config.calibration.dataset, base_dir=base),
                "eval_data": fingerprint(config.gate.eval_dataset, base_dir=base)}

    def run(self, config: StageConfig, ctx: StageContext) -> StageResult:
        assert isinstance(config, QuantizeConfig)
        model = ctx.input("model")
        if config.format == "nvfp4":  # one process (QuantizeConfig refuses ranks for it)
            return run_nvfp4(config, model.path / MODEL_HF, ctx.out_dir, progress=ctx.progress,
                             base_dir=_base_dir(ctx.recipe))
        if config.calibration.world_size() == 1:
            return run_quantize(config, model.path / MODEL_HF, ctx.out_dir, progress=ctx.progress,
                                base_dir=_base_dir(ctx.recipe))
        import shutil

        from trtbuild.core.cache import resume_in_use
        from trtbuild.quantize.distributed import resume_dir

        resume = resume_dir(config, model.key, self.key_material(config, ctx.recipe)["calibration_data"])
        with resume_in_use(resume):  # `cache gc` leaves the finished calibration alone while the stage runs
            result = run_quantize(config, model.path / MODEL_HF, ctx.out_dir, progress=ctx.progress,
                                  base_dir=_base_dir(ctx.recipe), resume=resume,
                                  recipe_name=getattr(ctx.recipe, "name", "") or "")
        shutil.rmtree(resume, ignore_errors=True)
        return result
