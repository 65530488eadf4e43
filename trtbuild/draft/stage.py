"""draft stage: an EAGLE-3 draft for the target, trained with ModelOpt or loaded and checked.

Sources: `train` (ModelOpt `modelopt.torch.speculative` eagle3 mode against the UNQUANTIZED target
of the model stage: the hidden states TRT-LLM captures at serving come from the same weights up to
quantization error, and ModelOpt trains on the BF16/FP32 model; online, or offline from hidden states
dumped once into the cache: trtbuild/draft/hidden.py), `path`
(a local draft directory) and `hub` (a repo id in the local HF cache, never downloaded); `none`
builds no draft. Loaded drafts are checked against the target before anything else runs.
The artifact holds `eagle3/` (the TRT-LLM EAGLE-3 checkpoint) and metrics with the acceptance
length tau measured with the project's runtime on held-out text.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from trtbuild.core.cache import default_root, resume_in_use
from trtbuild.core.code_version import code_version
from trtbuild.core.data.sources import fingerprint
from trtbuild.core.errors import UserError
from trtbuild.core.hf_files import hub_snapshot_commit
from trtbuild.core.layout import DRAFT_EAGLE3, MODEL_HF
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Stage, StageConfig, StageContext, StageResult
from trtbuild.draft.acceptance import evaluate, gate, numel, seeds
from trtbuild.draft.build import train_draft
from trtbuild.draft.compat import check_compatible
from trtbuild.draft.config import DraftConfig, DraftEval, DraftGate
from trtbuild.draft.format import read_draft
from trtbuild.draft.loaded import copy_draft, known_target_dir, loaded_dir, pickled, where
from trtbuild.draft.pickled import convert_into

__all__ = ["DraftConfig", "DraftEval", "DraftGate", "DraftStage", "resume_dir"]


def resume_dir(config: DraftConfig, target_key: str) -> Path:
    """Where an interrupted training keeps its checkpoints: outside the stage's temp dir, keyed by
    everything that shapes the training (config, target artifact, training code)."""
    # How many processes train is left out: a checkpoint is the same training whatever the split of
    # its global batches, so a killed run may resume with another process count.
    training = config.model_dump(mode="json", exclude={
        "eval": True, "gate": True, "compat_ignore": True, "export_dtype": True, "path": True, "repo_id": True,
        "revision": True, "train": {"processes": True, "nodes": True, "backend": True, "slurm": True}})
    code = [code_version(f"trtbuild.draft.{m}") for m in ("build", "model", "train", "distributed")]  # and imports
    digest = hashlib.sha256(json.dumps([training, target_key, code], sort_keys=True).encode()).hexdigest()
    return default_root() / "resume" / f"draft-{digest[:16]}"


class DraftStage(Stage):
    """EAGLE-3 draft: trained with ModelOpt against the unquantized target, or loaded and checked."""

    name = "draft"
    config_cls = DraftConfig
    depends_on = ("model",)
    libraries = ("torch", "transformers", "nvidia-modelopt", "safetensors", "tokenizers")

    def key_material(self, config: StageConfig, recipe: RecipeInfo) -> dict[str, Any]:
        assert isinstance(config, DraftConfig)
        base = recipe.base_dir
        eval_source = config.eval.dataset
        material: dict[str, Any] = {"eval_dataset": None if eval_source is None else fingerprint(eval_source, base_dir=base)}
        if config.source == "train":
            material["dataset"] = fingerprint(config.dataset, base_dir=recipe.base_dir)
        elif config.source == "path":
            assert config.path is not None  # required by the config's validator for this source
            directory = recipe.resolve_path(config.path)
            files = sorted(directory.rglob("*")) if directory.is_dir() else []
            material["files"] = [[str(f.relative_to(directory)), f.stat().st_size, f.stat().st_mtime_ns]
                                 for f in files if f.is_file()]
        elif config.source == "hub":
            material["commit"] = hub_snapshot_commit(config.repo_id or "", config.revision)
        return material

    def preflight(self, config: StageConfig, recipe: RecipeInfo) -> list[str]:
        """Check a loaded draft against a target that is already on disk (path / hub), before any work."""
        assert isinstance(config, DraftConfig)
        if config.source not in ("path", "hub"):
            return []
        try:
            draft_dir = loaded_dir(config, recipe)
        except UserError as exc:
            # Without the target's weights (a stand-in speaks for it) the draft is absent too:
            # `plan` lists the download and `build` refuses at the model stage.
            return [] if recipe.uses_standin() else [exc.one_line()]
        try:
            target_dir = known_target_dir(recipe)
            if target_dir is not None and not pickled(draft_dir):  # a pickle is checked once converted
                check_compatible(draft_dir, target_dir, ignore=config.compat_ignore, where=where(config))
        except UserError as exc:
            return [exc.one_line()]
        return []

    def run(self, config: StageConfig, ctx: StageContext) -> StageResult:
        assert isinstance(config, DraftConfig)
        if config.source == "none":
            return StageResult(metrics={"source": "none"}, info={"source": "none", "draft": None})
        if config.source == "ngram":
            return self._ngram(config, ctx)
        model_artifact = ctx.input("model")
        target_dir = model_artifact.path / MODEL_HF
        out = ctx.out_dir / DRAFT_EAGLE3
        info: dict[str, Any] = {
            "source": config.source,
            "target": {"stage": "model", "key": model_artifact.key, "quantized": False,
                       "note": "the draft is trained / checked against the UNQUANTIZED target (model stage)"},
        }
        metrics: dict[str, Any] = {"source": config.source, "max_draft_len": config.max_draft_len}
        if config.source == "train":
            resume = resume_dir(config, model_artifact.key)
            with resume_in_use(resume):  # `cache gc` leaves the resume dir alone while this trains
                trained = train_draft(config, ctx, target_dir, out, resume, model_artifact.key)
            metrics.update(trained["metrics"])
            info.update(trained["info"])
        else:
            source_dir = loaded_dir(config, ctx.recipe)
            if pickled(source_dir):  # published as pytorch_model.bin: weights-only load, safetensors copy
                info["converted"] = convert_into(source_dir, out, where(config), ctx.progress.log)
                check_compatible(out, target_dir, ignore=config.compat_ignore, where=where(config))
            else:
                check_compatible(source_dir, target_dir, ignore=config.compat_ignore, where=where(config))
                copy_draft(source_dir, out)
            info["loaded_from"] = str(source_dir.resolve())
            info["compat_ignored"] = list(config.compat_ignore)

        from trtbuild.draft.export import CONSUMERS

        draft = read_draft(out)
        info["consumers"] = list(CONSUMERS)
        info["format"] = {"config": "config.json (LlamaForCausalLMEagle3)", "weights": "model.safetensors"}
        metrics.update({"draft_vocab_size": draft.draft_vocab_size(),
                        "aux_layers": draft.aux_layer_ids(),
                        "draft_parameters": sum(numel(t.shape) for t in draft.tensors.values())})
        metrics.update(evaluate(config, ctx, target_dir, out))
        gate(config, metrics, seeds(config, ctx.recipe))
        return StageResult(metrics=metrics, info=info)

    @staticmethod
    def _ngram(config: DraftConfig, ctx: StageContext) -> StageResult:
        """No model to build: record the choice and measure prompt lookup's tau on the eval prompts."""
        metrics: dict[str, Any] = {"source": "ngram", "max_draft_len": config.max_draft_len,
                                   "max_matching_ngram_size": config.max_matching_ngram_size}
        (ctx.out_dir / "ngram.json").write_text(json.dumps(
            {"decoding_type": "NGram", "max_draft_len": config.max_draft_len,
             "max_matching_ngram_size": config.max_matching_ngram_size}, indent=2) + "\n")
        metrics.update(evaluate(config, ctx, ctx.input("model").path / MODEL_HF, None))
        gate(config, metrics, seeds(config, ctx.recipe))
        return StageResult(metrics=metrics, info={"source": "ngram", "draft": None})
