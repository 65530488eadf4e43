"""Which quantization a checkpoint directory declares, read the way TensorRT-LLM reads it.

Its own module so that the bundle, the engine checks and `plan` can all read it without importing
each other (the bundle is below the checks).
"""

from __future__ import annotations

from pathlib import Path

from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.model.config import ModelConfig
from trtbuild.quantize.config import QuantizeConfig


def quant_of_dir(directory: Path) -> tuple[str | None, str | None, str | None]:
    """(quant_algo, kv_cache_quant_algo, file) as TensorRT-LLM reads them: ModelOpt's hf_quant_config.json
    (`quantization`) first, then config.json's `quantization_config`; Nones when neither says."""
    import json

    for name, key in (("hf_quant_config.json", "quantization"), ("config.json", "quantization_config")):
        try:
            quant = json.loads((directory / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(quant, dict):
            return quant.get("quant_algo"), quant.get("kv_cache_quant_algo"), name
    return None, None, None


def checkpoint_quant(recipe: RecipeInfo) -> tuple[str | None, str | None]:
    """(quant_algo, kv_cache_quant_algo) of the checkpoint the engine will read."""
    quantize = recipe.section(QuantizeConfig)
    if quantize is not None:
        return ("NVFP4" if quantize.format == "nvfp4" else "FP8"), ("FP8" if quantize.kv_cache == "fp8" else None)
    model = recipe.section(ModelConfig)
    if model is not None and model.source == "path" and model.path:
        algo, kv_algo, said = quant_of_dir(recipe.resolve_path(model.path))
        if said:
            return algo, kv_algo
    if model is not None and model.source in ("path", "hub") and model.standin_config:
        # A published quantized checkpoint (e.g. NVIDIA's FP4 ones) whose weights are not here: its
        # stand-in directory carries the checkpoint's hf_quant_config.json / quantization_config.
        algo, kv_algo, _ = quant_of_dir(recipe.resolve_path(model.standin_config).parent)
        return algo, kv_algo
    return None, None
