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
import shutil
from pathlib import Path
from typing import Any

from trtbuild.core.cache import default_root, resume_in_use
from trtbuild.core.code_version import code_version
from trtbuild.core.data.sources import fingerprint
from trtbuild.core.errors import BuildError, UserError
from trtbuild.core.hf_files import hub_snapshot_commit, hub_snapshot_dir, pickle_files, refuse_pickles
from trtbuild.core.layout import DRAFT_EAGLE3, MODEL_HF
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Stage, StageConfig, StageContext, StageResult
from trtbuild.draft.build import train_draft
from trtbuild.draft.compat import check_compatible
from trtbuild.draft.config import DraftConfig, DraftEval, DraftGate
from trtbuild.draft.evaluate import evaluate_draft
from trtbuild.draft.format import read_draft
from trtbuild.draft.pickled import PUBLISHED, check_archive, convert_into, is_published_pickle_draft
from trtbuild.model.config import ModelConfig

__all__ = ["DraftConfig", "DraftEval", "DraftGate", "DraftStage", "resume_dir"]

_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def _hub_dir(config: DraftConfig) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(config.repo_id, revision=config.revision, local_files_only=True,
                                      allow_patterns=_HUB_PATTERNS))
    except LocalEntryNotFoundError:
        raise UserError(f"draft '{config.repo_id}' ({config.revision}) is not in the local HF cache",
                        field="draft.repo_id",
                        fix=f"run `hf download {config.repo_id}` on a connected machine") from None


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
            draft_dir = self._loaded_dir(config, recipe)
        except UserError as exc:
            # Without the target's weights (a stand-in speaks for it) the draft is absent too:
            # `plan` lists the download and `build` refuses at the model stage.
            return [] if recipe.uses_standin() else [exc.one_line()]
        try:
            target_dir = _known_target_dir(recipe)
            if target_dir is not None and not _pickled(draft_dir):  # a pickle is checked once converted
                check_compatible(draft_dir, target_dir, ignore=config.compat_ignore, where=_where(config))
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
            source_dir = self._loaded_dir(config, ctx.recipe)
            if _pickled(source_dir):  # published as pytorch_model.bin: weights-only load, safetensors copy
                info["converted"] = convert_into(source_dir, out, _where(config), ctx.progress.log)
                check_compatible(out, target_dir, ignore=config.compat_ignore, where=_where(config))
            else:
                check_compatible(source_dir, target_dir, ignore=config.compat_ignore, where=_where(config))
                _copy_draft(source_dir, out)
            info["loaded_from"] = str(source_dir.resolve())
            info["compat_ignored"] = list(config.compat_ignore)

        from trtbuild.draft.export import CONSUMERS

        draft = read_draft(out)
        info["consumers"] = list(CONSUMERS)
        info["format"] = {"config": "config.json (LlamaForCausalLMEagle3)", "weights": "model.safetensors"}
        metrics.update({"draft_vocab_size": draft.draft_vocab_size(),
                        "aux_layers": draft.aux_layer_ids(),
                        "draft_parameters": sum(_numel(t.shape) for t in draft.tensors.values())})
        metrics.update(_evaluate(config, ctx, target_dir, out))
        _gate(config, metrics, _seeds(config, ctx.recipe))
        return StageResult(metrics=metrics, info=info)

    @staticmethod
    def _ngram(config: DraftConfig, ctx: StageContext) -> StageResult:
        """No model to build: record the choice and measure prompt lookup's tau on the eval prompts."""
        metrics: dict[str, Any] = {"source": "ngram", "max_draft_len": config.max_draft_len,
                                   "max_matching_ngram_size": config.max_matching_ngram_size}
        (ctx.out_dir / "ngram.json").write_text(json.dumps(
            {"decoding_type": "NGram", "max_draft_len": config.max_draft_len,
             "max_matching_ngram_size": config.max_matching_ngram_size}, indent=2) + "\n")
        metrics.update(_evaluate(config, ctx, ctx.input("model").path / MODEL_HF, None))
        _gate(config, metrics, _seeds(config, ctx.recipe))
        return StageResult(metrics=metrics, info={"source": "ngram", "draft": None})

    @staticmethod
    def _loaded_dir(config: DraftConfig, recipe: RecipeInfo) -> Path:
        if config.source == "path":
            directory = recipe.resolve_path(config.path)
            if not directory.is_dir():
                raise UserError(f"directory not found: {directory}", field="draft.path",
                                fix="give an existing EAGLE-3 draft directory")
        else:
            directory = _hub_dir(config)

        if is_published_pickle_draft(directory, pickle_files(directory)):
            check_archive(directory / PUBLISHED, _where(config))
        else:
            refuse_pickles(directory, _where(config))
        return directory


def _pickled(directory: Path) -> bool:
    return is_published_pickle_draft(directory, pickle_files(directory))


def _where(config: DraftConfig) -> str:
    return "draft.path" if config.source == "path" else "draft.repo_id"


def _known_target_dir(recipe: RecipeInfo) -> Path | None:
    """The target's directory when it exists before the build (model.source path or hub)."""
    model = recipe.section(ModelConfig)
    if model is None or model.source not in ("path", "hub"):
        return None
    if model.source == "path":
        directory = recipe.resolve_path(model.path)
        return directory if (directory / "config.json").is_file() else None
    directory = hub_snapshot_dir(model.repo_id or "", model.revision)
    return directory if directory is not None and (directory / "config.json").is_file() else None


def _copy_draft(source: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for file in sorted(source.iterdir()):
        if file.is_file() and not file.name.startswith("."):
            shutil.copyfile(file.resolve(), out / file.name)


def _numel(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _evaluate(config: DraftConfig, ctx: StageContext, target_dir: Path, draft_dir: Path | None
              ) -> dict[str, Any]:
    """tau on the eval prompts: of the EAGLE-3 draft in draft_dir, or of n-gram lookup (None)."""
    if config.eval.prompts == 0:
        return {"acceptance_length": None}

    return evaluate_draft(target_dir, draft_dir, config.eval, config.max_draft_len, ctx,
                          max_matching_ngram_size=config.max_matching_ngram_size)


def _seeds(config: DraftConfig, recipe: RecipeInfo) -> str:
    """The seeds that shaped the measured tau: the draft's, and the tiny target's when it is one."""
    seeds = f"draft.seed {config.seed}"
    model = recipe.section(ModelConfig)
    if model is not None and model.source == "tiny":
        seeds += f", model.tiny.seed {model.tiny.seed}"
    return seeds


def _gate(config: DraftConfig, metrics: dict[str, Any], seeds: str = "") -> None:
    wanted = config.gate.min_acceptance_length
    if wanted is None:
        return
    tau = metrics.get("acceptance_length")
    if tau is None:
        raise UserError("draft.gate.min_acceptance_length is set but the evaluation is off (eval.prompts: 0)",
                        field="draft.gate.min_acceptance_length", fix="set draft.eval.prompts > 0")
    if tau < wanted:
        error = BuildError(f"measured acceptance length {tau:.3f} < gate {wanted} at max_draft_len "
                           f"{config.max_draft_len} ({config.eval.mode}, {seeds or 'seed unknown'})",
                           field="draft.gate.min_acceptance_length",
                           fix="train longer (draft.steps / draft.samples) or lower the gate")
        error.metrics = dict(metrics)  # type: ignore[attr-defined]  # reported by `build --json`
        raise error
