"""draft stage: an EAGLE-3 draft for the target, trained with ModelOpt or loaded and checked.

Sources: `train` (ModelOpt `modelopt.torch.speculative` eagle3 mode, online, against the
UNQUANTIZED target of the model stage: the hidden states TRT-LLM captures at serving come from
the same weights up to quantization error, and ModelOpt trains on the BF16/FP32 model), `path`
(a local draft directory) and `hub` (a repo id in the local HF cache, never downloaded); `none`
builds no draft. Loaded drafts are checked against the target before anything else runs.
The artifact holds `eagle3/` (the TRT-LLM EAGLE-3 checkpoint) and metrics with the acceptance
length tau measured with the project's runtime on held-out text.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trtbuild.data.sources import TextSource
from trtbuild.errors import BuildError, UserError
from trtbuild.stages.base import Stage, StageConfig, StageContext, StageResult

_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


class DraftGate(StageConfig):
    min_acceptance_length: float | None = Field(
        default=None, ge=1.0, description="Fail the build when the measured mean acceptance length tau "
        "(tokens per target step, bonus token included) is below this. Unset: no gate.")


class DraftEval(StageConfig):
    dataset: TextSource = Field(default=TextSource(kind="pydoc"), description="Held-out text the prompts "
                                "come from (its eval split: pydoc's held-out paragraphs).")
    prompts: int = Field(default=8, ge=0, le=10**5, description="Number of prompts: the first prompt_len "
                         "tokens (BOS included) of records evenly spaced over the eval split, as `trtbuild "
                         "bench` makes them; 0 skips the evaluation (then no gate can be checked).")
    prompt_len: int = Field(default=64, ge=1, le=1 << 20, description="Prompt length in tokens.")
    new_tokens: int = Field(default=128, ge=1, le=1 << 20, description="Tokens generated per prompt (greedy target).")
    mode: Literal["chain", "tree"] = Field(default="chain", description="Speculation shape used by the "
                                           "runtime: one chain of max_draft_len tokens, or a tree.")


class DraftConfig(StageConfig):
    source: Literal["train", "path", "hub", "ngram", "none"] = Field(
        default="train", description="train: EAGLE-3 training with ModelOpt against the target; path: a "
        "local draft directory; hub: a repo id in the local HF cache (offline); ngram: no draft model, "
        "prompt lookup (TRT-LLM's NGram speculative decoding; the stage measures its tau); none: no "
        "speculative decoding.")
    path: str | None = Field(default=None, description="source: path: the EAGLE-3 draft directory.")
    repo_id: str | None = Field(default=None,
                                description="source: hub: e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B.")
    revision: str = Field(default="main", description="source: hub: branch, tag or commit.")
    compat_ignore: list[str] = Field(default_factory=list, description="Compatibility checks to waive for a "
                                     "loaded draft (names from trtbuild.eagle3.compat.CHECKS, e.g. rope).")
    max_draft_len: int = Field(default=3, ge=1, le=16, description="Draft tokens per step, as the engine "
                               "(speculative_config.max_draft_len) and the runtime use it.")
    max_matching_ngram_size: int = Field(default=2, ge=1, le=16, description="source: ngram: longest suffix "
                                         "of the context looked up (TRT-LLM's max_matching_ngram_size).")
    aux_layers: list[int] | None = Field(
        default=None, description="Target layers whose hidden states feed the draft. Default: TRT-LLM's "
        "{1, L/2-1, L-4}, clipped and de-duplicated.")
    draft_vocab_size: int | None = Field(
        default=None, ge=1, le=1 << 24, description="Draft vocabulary: the most frequent target tokens of the training "
        "data (d2t). Default: the full vocab.")
    intermediate_size: int | None = Field(default=None, ge=1, le=1 << 20, description="Draft MLP width. Default: the "
                                          "target's.")
    dataset: TextSource = Field(
        default=TextSource(kind="pydoc"), description="Training text (train split): pydoc, a .txt/.jsonl "
        "file (chat jsonl rendered with the chat template), or hf.")
    samples: int = Field(default=512, ge=1, le=10**7, description="Training sequences in the pool.")
    distill_fraction: float = Field(default=0.5, ge=0.0, le=1.0, description="Share of the pool that is the "
                                    "target's own greedy continuation of training-text prompts.")
    prompt_len: int = Field(default=16, ge=1, le=1 << 20, description="Prompt tokens of each generated sequence.")
    steps: int | None = Field(default=None, ge=1, le=10**8, description="Optimizer steps; default: epochs x samples / "
                              "batch_size.")
    epochs: float = Field(default=1.0, gt=0, le=1e4, description="Passes over the pool when `steps` is unset.")
    lr: float = Field(default=1e-3, gt=0, le=10, description="Peak learning rate (AdamW, warmup then cosine).")
    batch_size: int = Field(default=8, ge=1, le=1 << 16, description="Sequences per step.")
    seq_len: int = Field(default=128, ge=8, le=1 << 20, description="Tokens per training sequence.")
    ttt_steps: int = Field(default=3, ge=1, le=8, description="Training-time-test unroll length (draft "
                           "steps trained on its own outputs).")
    loss_decay: float = Field(default=0.9, gt=0, le=1, description="Loss weight decay per unroll step.")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of data sampling, initialisation and batch order.")
    checkpoint_every: int = Field(default=25, ge=1, le=10**8, description="Steps between resume checkpoints.")
    export_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="dtype of the exported draft; auto: the target's.")
    gate: DraftGate = Field(default_factory=DraftGate, description="Build gate on the acceptance length.")
    eval: DraftEval = Field(default_factory=DraftEval, description="Acceptance evaluation on held-out text.")

    @model_validator(mode="after")
    def _source_fields(self) -> DraftConfig:
        if self.source == "path" and not self.path:
            raise ValueError("source: path needs `path:` (a local EAGLE-3 draft directory)")
        if self.source == "hub" and not self.repo_id:
            raise ValueError("source: hub needs `repo_id:` (an EAGLE-3 draft in the local HF cache)")
        if self.aux_layers is not None and not self.aux_layers:
            raise ValueError("aux_layers must name at least one target layer (or be left unset)")
        return self

    def total_steps(self) -> int:
        return self.steps or max(1, round(self.epochs * self.samples / self.batch_size))


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
    from trtbuild.cache import default_root
    from trtbuild.eagle3 import data, model, train

    training = config.model_dump(mode="json", exclude={"eval", "gate", "compat_ignore", "export_dtype",
                                                        "path", "repo_id", "revision"})
    code = "".join(inspect.getsource(m) for m in (data, model, train))
    digest = hashlib.sha256(json.dumps([training, target_key, code], sort_keys=True).encode()).hexdigest()
    return default_root() / "resume" / f"draft-{digest[:16]}"


class DraftStage(Stage):
    """EAGLE-3 draft: trained with ModelOpt against the unquantized target, or loaded and checked."""

    name = "draft"
    config_cls = DraftConfig
    depends_on = ("model",)
    libraries = ("torch", "transformers", "nvidia-modelopt", "safetensors", "tokenizers")
    code_modules = ("trtbuild.eagle3.format", "trtbuild.eagle3.vocab", "trtbuild.eagle3.compat",
                    "trtbuild.eagle3.model", "trtbuild.eagle3.data", "trtbuild.eagle3.train",
                    "trtbuild.eagle3.export", "trtbuild.eagle3.evaluate", "trtbuild.eagle3.build",
                    "trtbuild.data.sources", "trtbuild.data.pydoc_corpus", "trtbuild.data.chat")

    def key_material(self, config: StageConfig, recipe: Any) -> dict[str, Any]:
        assert isinstance(config, DraftConfig)
        from trtbuild.data.sources import fingerprint

        base = recipe.base_dir
        material: dict[str, Any] = {"eval_dataset": fingerprint(config.eval.dataset, base_dir=base)}
        if config.source == "train":
            material["dataset"] = fingerprint(config.dataset, base_dir=recipe.base_dir)
        elif config.source == "path":
            directory = recipe.resolve_path(config.path)
            files = sorted(directory.rglob("*")) if directory.is_dir() else []
            material["files"] = [[str(f.relative_to(directory)), f.stat().st_size, f.stat().st_mtime_ns]
                                 for f in files if f.is_file()]
        elif config.source == "hub":
            from trtbuild.stages.model import _hub_snapshot_commit

            material["commit"] = _hub_snapshot_commit(config.repo_id or "", config.revision)
        return material

    def preflight(self, config: StageConfig, recipe: Any) -> list[str]:
        """Check a loaded draft against a target that is already on disk (path / hub), before any work."""
        assert isinstance(config, DraftConfig)
        if config.source not in ("path", "hub"):
            return []
        try:
            draft_dir = self._loaded_dir(config, recipe)
        except UserError as exc:
            from trtbuild.stages.model import uses_standin

            # Without the target's weights (a stand-in speaks for it) the draft is absent too:
            # `plan` lists the download and `build` refuses at the model stage.
            return [] if uses_standin(recipe) else [exc.one_line()]
        try:
            target_dir = _known_target_dir(recipe)
            if target_dir is not None:
                from trtbuild.eagle3.compat import check_compatible

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
        target_dir = model_artifact.path / "hf"
        out = ctx.out_dir / "eagle3"
        info: dict[str, Any] = {
            "source": config.source,
            "target": {"stage": "model", "key": model_artifact.key, "quantized": False,
                       "note": "the draft is trained / checked against the UNQUANTIZED target (model stage)"},
        }
        metrics: dict[str, Any] = {"source": config.source, "max_draft_len": config.max_draft_len}
        if config.source == "train":
            from trtbuild.cache import resume_in_use
            from trtbuild.eagle3.build import train_draft

            resume = resume_dir(config, model_artifact.key)
            with resume_in_use(resume):  # `cache gc` leaves the resume dir alone while this trains
                trained = train_draft(config, ctx, target_dir, out, resume)
            metrics.update(trained["metrics"])
            info.update(trained["info"])
        else:
            from trtbuild.eagle3.compat import check_compatible

            source_dir = self._loaded_dir(config, ctx.recipe)
            check_compatible(source_dir, target_dir, ignore=config.compat_ignore, where=_where(config))
            _copy_draft(source_dir, out)
            info["loaded_from"] = str(source_dir.resolve())
            info["compat_ignored"] = list(config.compat_ignore)

        from trtbuild.eagle3.export import CONSUMERS
        from trtbuild.eagle3.format import read_draft

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
        metrics.update(_evaluate(config, ctx, ctx.input("model").path / "hf", None))
        _gate(config, metrics, _seeds(config, ctx.recipe))
        return StageResult(metrics=metrics, info={"source": "ngram", "draft": None})

    @staticmethod
    def _loaded_dir(config: DraftConfig, recipe: Any) -> Path:
        if config.source == "path":
            directory = recipe.resolve_path(config.path)
            if not directory.is_dir():
                raise UserError(f"directory not found: {directory}", field="draft.path",
                                fix="give an existing EAGLE-3 draft directory")
        else:
            directory = _hub_dir(config)
        from trtbuild.stages.model import refuse_pickles

        refuse_pickles(directory, _where(config))
        return directory


def _where(config: DraftConfig) -> str:
    return "draft.path" if config.source == "path" else "draft.repo_id"


def _known_target_dir(recipe: Any) -> Path | None:
    """The target's directory when it exists before the build (model.source path or hub)."""
    model = recipe.stage_config("model")
    if model is None or getattr(model, "source", None) not in ("path", "hub"):
        return None
    if model.source == "path":
        directory = recipe.resolve_path(model.path)
        return directory if (directory / "config.json").is_file() else None
    from trtbuild.stages.model import _hub_snapshot_commit, hf_cache_dir

    commit = _hub_snapshot_commit(model.repo_id or "", model.revision)
    if commit is None:
        return None
    directory = hf_cache_dir() / ("models--" + model.repo_id.replace("/", "--")) / "snapshots" / commit
    return directory if (directory / "config.json").is_file() else None


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
    from trtbuild.eagle3.evaluate import evaluate_draft

    return evaluate_draft(target_dir, draft_dir, config.eval, config.max_draft_len, ctx,
                          max_matching_ngram_size=config.max_matching_ngram_size)


def _seeds(config: DraftConfig, recipe: Any) -> str:
    """The seeds that shaped the measured tau: the draft's, and the tiny target's when it is one."""
    seeds = f"draft.seed {config.seed}"
    model = recipe.stage_config("model") if hasattr(recipe, "stage_config") else None
    if model is not None and getattr(model, "source", None) == "tiny" and getattr(model, "tiny", None):
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
