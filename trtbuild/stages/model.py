"""model stage: resolve the target model to a local Hugging Face directory.

Sources: `tiny` (the embedded default, trained here on the pydoc corpus), `path` (a local HF
directory, linked, not copied) and `hub` (a repo id resolved from the local HF cache; downloads
only when `allow_download` is true). Only safetensors weights are accepted, and remote code is
refused unless the recipe turns `trust_remote_code` on.

Stand-ins: a `path` / `hub` recipe may name `standin_config`, a config.json with the real model's
published shapes. Where the weights are not on this machine, `validate`, `plan` and every stage's
preflight read the shapes from it (`target_hf_config`), so a GPU recipe can be checked anywhere;
`build` still refuses without the weights. Where the weights are present, the stand-in is only
compared with the real config.json, so a stale stand-in is reported rather than trusted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trtbuild.errors import UserError
from trtbuild.stages.base import Stage, StageConfig, StageContext, StageResult
from trtbuild.tiny import TinyModelConfig

_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
# Shape keys a stand-in must carry (top level or under text_config) and that must agree with the real
# config.json once the weights are present.
STANDIN_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "vocab_size")


class ModelConfig(StageConfig):
    source: Literal["tiny", "path", "hub"] = Field(
        default="tiny", description="Where the target comes from: the embedded tiny Llama, a local HF "
        "directory, or a Hugging Face repo id in the local HF cache.")
    path: str | None = Field(default=None, description="source: path: the HF model directory.")
    repo_id: str | None = Field(default=None,
                                description="source: hub: e.g. meta-llama/Llama-3.1-8B-Instruct.")
    revision: str = Field(default="main", description="source: hub: branch, tag or commit.")
    allow_download: bool = Field(default=False, description="source: hub: fetch from the Hub when the "
                                 "local cache lacks it (off: builds never touch the network).")
    trust_remote_code: bool = Field(default=False, description="Allow models whose config.json asks for "
                                    "custom code (auto_map). Off by default.")
    tiny: TinyModelConfig = Field(
        default_factory=TinyModelConfig,
        description="source: tiny: architecture and training of the embedded target.")
    standin_config: str | None = Field(
        default=None, description="source: path / hub: a config.json with the real model's published shapes "
        "(relative to the recipe). Where the weights are not on this machine, validate / plan / preflight "
        "read the shapes from it; build still needs the weights.")

    @model_validator(mode="after")
    def _source_fields(self) -> ModelConfig:
        if self.source == "path" and not self.path:
            raise ValueError("source: path needs `path:` (a local Hugging Face model directory)")
        if self.source == "hub" and not self.repo_id:
            raise ValueError("source: hub needs `repo_id:` (e.g. meta-llama/Llama-3.1-8B-Instruct)")
        if self.source == "tiny" and self.standin_config:
            raise ValueError("standin_config is for source: path or hub (the tiny target's shapes come from "
                             "model.tiny)")
        return self


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return home / "hub"


def _hub_snapshot_commit(repo_id: str, revision: str) -> str | None:
    """The commit the local HF cache resolves `revision` to, read without importing huggingface_hub."""
    repo_dir = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    ref = repo_dir / "refs" / revision
    if ref.is_file():
        return ref.read_text().strip()
    if (repo_dir / "snapshots" / revision).is_dir():
        return revision
    return None


def hub_snapshot_dir(repo_id: str, revision: str) -> Path | None:
    """The local HF cache's snapshot directory of `repo_id` at `revision`, or None when not cached."""
    commit = _hub_snapshot_commit(repo_id, revision)
    if commit is None:
        return None
    return hf_cache_dir() / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit


def local_model_dir(config: ModelConfig, recipe: Any) -> Path | None:
    """The target's directory on this machine (source path, or the hub snapshot) when its config.json
    is there; None for the tiny target (built, not found) and for weights that are absent."""
    if config.source == "path" and config.path:
        directory: Path | None = recipe.resolve_path(config.path)
    elif config.source == "hub" and config.repo_id:
        directory = hub_snapshot_dir(config.repo_id, config.revision)
    else:
        return None
    return directory if directory is not None and (directory / "config.json").is_file() else None


def standin_path(config: ModelConfig, recipe: Any) -> Path | None:
    return recipe.resolve_path(config.standin_config) if config.standin_config else None


def uses_standin(recipe: Any) -> bool:
    """True when the recipe's target is absent here and a stand-in config speaks for it."""
    config = recipe.stage_config("model")
    return (config is not None and config.source in ("path", "hub") and bool(config.standin_config)
            and local_model_dir(config, recipe) is None)


def target_hf_config(recipe: Any) -> tuple[dict[str, Any], str] | None:
    """The target's config.json and where it was read: the real one when it is on this machine, else
    the stand-in's. None for the tiny target and when neither is readable (preflight says why)."""
    config = recipe.stage_config("model")
    if config is None:
        return None
    directory = local_model_dir(config, recipe)
    file = directory / "config.json" if directory is not None else standin_path(config, recipe)
    if file is None:
        return None
    data, _ = _read_config(file)
    if data is None:
        return None
    return data, (str(file) if directory is not None else f"stand-in {file}")


def text_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The language model's section: `text_config` of multimodal configs (Llama 4), else the config."""
    text = hf_config.get("text_config")
    return text if isinstance(text, dict) else hf_config


def _read_config(file: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(config, None) or (None, why it cannot be read)."""
    try:
        data = json.loads(file.read_text())
    except OSError:
        return None, f"{file} not found"
    except ValueError as exc:
        return None, f"{file} is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"{file} is not a JSON object"
    return data, None


def standin_problems(config: ModelConfig, recipe: Any, real: dict[str, Any] | None) -> list[str]:
    """The stand-in must exist, carry the shape keys and, once the weights are here, match them."""
    file = standin_path(config, recipe)
    if file is None:
        return []
    data, error = _read_config(file)
    fix = "write the real model's published config.json there, or fix model.standin_config"
    if data is None:
        return [f"model.standin_config: stand-in {error} (fix: {fix})"]
    text = text_config(data)
    missing = [k for k in STANDIN_KEYS if not isinstance(text.get(k), int)]
    if missing:
        return [f"model.standin_config: stand-in {file} lacks {', '.join(missing)} (fix: {fix})"]
    if real is None:
        return []
    real_text = text_config(real)
    differ = [f"{k} {text[k]} (stand-in) != {real_text.get(k)} (real config.json)"
              for k in STANDIN_KEYS if real_text.get(k) is not None and real_text.get(k) != text[k]]
    if differ:
        return [f"model.standin_config: stand-in {file} no longer matches the model: {'; '.join(differ)} "
                "(fix: copy the real config.json over the stand-in, or remove model.standin_config)"]
    return []


def _fingerprint(directory: Path) -> list[list[Any]]:
    """Cheap identity of a local model: names, sizes and mtimes (hashing 16 GB per plan is too slow)."""
    rows = []
    for file in sorted(directory.rglob("*")):
        if file.is_file():
            st = file.stat()
            rows.append([str(file.relative_to(directory)), st.st_size, st.st_mtime_ns])
    return rows


# Files that hold Python pickles (loading one can run any code): a model directory holding one is
# refused outright, so no loader's fallback can ever reach it.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")


def pickle_files(directory: Path) -> list[Path]:
    """Pickle-format files anywhere under `directory` (symlinked files included), sorted."""
    return sorted(p for p in directory.rglob("*") if p.name.lower().endswith(PICKLE_SUFFIXES) and p.is_file())


def refuse_pickles(directory: Path, where: str) -> None:
    found = pickle_files(directory)
    if found:
        names = ", ".join(str(p.relative_to(directory)) for p in found[:3]) + (" ..." if len(found) > 3 else "")
        raise UserError(f"{directory} holds pickle files ({names}); trtbuild loads safetensors only and refuses "
                        "a directory where a loader could fall back to a pickle", field=where,
                        fix="delete or move those files out of the directory (convert to safetensors first if "
                        "they are the only weights)")


def check_hf_directory(directory: Path, config: ModelConfig, where: str) -> dict[str, Any]:
    """Refuse what we cannot or must not load; return config.json."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise UserError(f"{directory} has no config.json", field=where,
                        fix="point at a Hugging Face model directory")
    hf_config, error = _read_config(config_file)
    if hf_config is None:
        raise UserError(f"{error}", field=where, fix="restore the model's config.json")
    refuse_pickles(directory, where)
    weights = list(directory.glob("*.safetensors"))
    if not weights:
        raise UserError(f"{directory} has no *.safetensors weights; only safetensors are loaded",
                        field=where, fix="convert the checkpoint to safetensors")
    if hf_config.get("auto_map") and not config.trust_remote_code:
        raise UserError(f"{directory} needs custom code (config.json auto_map) and trust_remote_code is off",
                        field="model.trust_remote_code",
                        fix="review the code, then set model.trust_remote_code: true")
    return hf_config


class ModelStage(Stage):
    """Resolve the target model: the embedded tiny Llama, a local HF directory, or the offline HF cache."""

    name = "model"
    config_cls = ModelConfig
    libraries = ("torch", "transformers", "tokenizers", "safetensors")

    def key_material(self, config: StageConfig, recipe: Any) -> dict[str, Any]:
        assert isinstance(config, ModelConfig)
        if config.source == "path":
            directory = recipe.resolve_path(config.path)
            if not directory.is_dir() and config.standin_config:
                return {"path": str(directory), "files": None}  # absent here: plan on the stand-in
            if not directory.is_dir():
                pos = recipe.position_of(("model", "path"))
                raise UserError(f"directory not found: {directory}", file=pos.file if pos else None,
                                line=pos.line if pos else None, field="model.path",
                                fix="give an existing Hugging Face model directory")
            return {"path": str(directory), "files": _fingerprint(directory)}
        if config.source == "hub":
            return {"commit": _hub_snapshot_commit(config.repo_id or "", config.revision)}
        return {}

    def preflight(self, config: StageConfig, recipe: Any) -> list[str]:
        """Cheap checks of the source before any work (files present, cache populated)."""
        assert isinstance(config, ModelConfig)
        local = local_model_dir(config, recipe)
        if config.standin_config:
            real = _read_config(local / "config.json")[0] if local is not None else None
            problems = standin_problems(config, recipe, real)
            if problems or local is None:
                return problems  # absent weights are expected here: `plan` says so, `build` refuses
        if config.source == "path":
            directory = recipe.resolve_path(config.path)
            if not directory.is_dir():
                return [f"model.path: directory not found: {directory} "
                        "(fix: give an existing HF model directory)"]
            try:
                check_hf_directory(directory, config, "model.path")
            except UserError as exc:
                return [exc.one_line()]
        if (config.source == "hub" and not config.allow_download
                and _hub_snapshot_commit(config.repo_id or "", config.revision) is None):
            return [f"model.repo_id: '{config.repo_id}' ({config.revision}) is not in the local HF cache "
                    f"{hf_cache_dir()} (fix: `hf download {config.repo_id}` on a connected machine, "
                    "or set model.allow_download: true)"]
        return []

    def run(self, config: StageConfig, ctx: StageContext) -> StageResult:
        assert isinstance(config, ModelConfig)
        hf_dir = ctx.out_dir / "hf"
        if config.source == "tiny":
            from trtbuild.tiny import build_tiny_model

            metrics = build_tiny_model(config.tiny, hf_dir, ctx.progress)
            return StageResult(metrics=metrics, info={"source": "tiny"})
        if config.source == "path":
            source_dir = ctx.recipe.resolve_path(config.path)
            where = "model.path"
            if not source_dir.is_dir():  # a stand-in let plan through; the build needs the weights
                raise UserError(f"directory not found: {source_dir}", field=where,
                                fix="give an existing Hugging Face model directory")
        else:
            source_dir = self._resolve_hub(config)
            where = "model.repo_id"
        hf_config = check_hf_directory(source_dir, config, where)
        hf_dir.symlink_to(source_dir.resolve(), target_is_directory=True)
        return StageResult(metrics=_shape_metrics(hf_config, source_dir),
                           info={"source": config.source, "resolved": str(source_dir.resolve())})

    def _resolve_hub(self, config: ModelConfig) -> Path:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(config.repo_id, revision=config.revision,
                                          local_files_only=not config.allow_download,
                                          allow_patterns=_HUB_PATTERNS))
        except LocalEntryNotFoundError as exc:
            raise UserError(f"'{config.repo_id}' ({config.revision}) is not in the local HF cache "
                            f"({hf_cache_dir()})", field="model.repo_id",
                            fix=f"run `hf download {config.repo_id}` on a connected machine, "
                            "or set model.allow_download: true") from exc


def _shape_metrics(hf_config: dict[str, Any], directory: Path) -> dict[str, Any]:
    from trtbuild.safetensors_header import count_parameters

    text = text_config(hf_config)
    return {
        "architecture": (hf_config.get("architectures") or ["?"])[0],
        "num_hidden_layers": text.get("num_hidden_layers"),
        "hidden_size": text.get("hidden_size"),
        "vocab_size": text.get("vocab_size"),
        "parameters": count_parameters(directory),
    }
