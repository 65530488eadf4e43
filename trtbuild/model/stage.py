"""model stage: resolve the target model to a local Hugging Face directory.

Sources: `tiny` (the embedded default, trained here on the pydoc corpus), `path` (a local HF
directory, linked, not copied), `hub` (a repo id resolved from the local HF cache; downloads
only when `allow_download` is true) and `gguf` (a GGUF file, dequantized once into the artifact:
trtbuild/model/gguf.py). Only safetensors weights are accepted, and remote code is
refused unless the recipe turns `trust_remote_code` on.

Stand-ins: a `path` / `hub` recipe may name `standin_config`, a config.json with the real model's
published shapes. Where the weights are not on this machine, `validate`, `plan` and every stage's
preflight read the shapes from it (`target_hf_config`), so a GPU recipe can be checked anywhere;
`build` still refuses without the weights. Where the weights are present, the stand-in is only
compared with the real config.json, so a stale stand-in is reported rather than trusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtbuild.core.cache import sha256_file
from trtbuild.core.errors import UserError
from trtbuild.core.layout import MODEL_HF
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.safetensors_header import count_parameters
from trtbuild.core.stage import Stage, StageConfig, StageContext, StageResult
from trtbuild.model import gguf
from trtbuild.model.source import (
    ModelConfig,
    check_hf_directory,
    hf_cache_dir,
    hub_snapshot_commit,
    local_model_dir,
    read_config,
    standin_problems,
    text_config,
)
from trtbuild.model.tiny import build_tiny_model

__all__ = ["ModelConfig", "ModelStage"]

_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


def _fingerprint(directory: Path) -> list[list[Any]]:
    """Cheap identity of a local model: names, sizes and mtimes (hashing 16 GB per plan is too slow)."""
    rows = []
    for file in sorted(directory.rglob("*")):
        if file.is_file():
            st = file.stat()
            rows.append([str(file.relative_to(directory)), st.st_size, st.st_mtime_ns])
    return rows


class ModelStage(Stage):
    """Resolve the target model: the embedded tiny Llama, a local HF directory, or the offline HF cache."""

    name = "model"
    config_cls = ModelConfig
    libraries = ("torch", "transformers", "tokenizers", "safetensors", "gguf")

    def key_material(self, config: StageConfig, recipe: RecipeInfo) -> dict[str, Any]:
        assert isinstance(config, ModelConfig)
        if config.source == "path":
            assert config.path is not None  # required by the config's validator for this source
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
            return {"commit": hub_snapshot_commit(config.repo_id or "", config.revision)}
        if config.source == "gguf":
            return {"gguf_sha256": sha256_file(gguf.locate(config, recipe))}
        return {}

    def preflight(self, config: StageConfig, recipe: RecipeInfo) -> list[str]:
        """Cheap checks of the source before any work (files present, cache populated)."""
        assert isinstance(config, ModelConfig)
        local = local_model_dir(config, recipe)
        if config.standin_config:
            real = read_config(local / "config.json")[0] if local is not None else None
            problems = standin_problems(config, recipe, real)
            if problems or local is None:
                return problems  # absent weights are expected here: `plan` says so, `build` refuses
        if config.source == "path":
            assert config.path is not None  # required by the config's validator for this source
            directory = recipe.resolve_path(config.path)
            if not directory.is_dir():
                return [f"model.path: directory not found: {directory} "
                        "(fix: give an existing HF model directory)"]
            try:
                check_hf_directory(directory, config, "model.path")
            except UserError as exc:
                return [exc.one_line()]
        if config.source == "gguf":
            try:
                gguf.locate(config, recipe)
            except UserError as exc:
                return [exc.one_line()]
        if (config.source == "hub" and not config.allow_download
                and hub_snapshot_commit(config.repo_id or "", config.revision) is None):
            return [f"model.repo_id: '{config.repo_id}' ({config.revision}) is not in the local HF cache "
                    f"{hf_cache_dir()} (fix: `hf download {config.repo_id}` on a connected machine, "
                    "or set model.allow_download: true)"]
        return []

    def run(self, config: StageConfig, ctx: StageContext) -> StageResult:
        assert isinstance(config, ModelConfig)
        hf_dir = ctx.out_dir / MODEL_HF
        if config.source == "tiny":
            metrics = build_tiny_model(config.tiny, hf_dir, ctx.progress)
            return StageResult(metrics=metrics, info={"source": "tiny"})
        if config.source == "gguf":
            file = gguf.locate(config, ctx.recipe)
            with ctx.progress.task(f"model: dequantizing {file.name} to {config.gguf_dtype}", None):
                info = gguf.dequantize(file, hf_dir, config.gguf_dtype)
            hf_config = check_hf_directory(hf_dir, config, "model.path")
            return StageResult(metrics=_shape_metrics(hf_config, hf_dir), info={"source": "gguf", **info})
        if config.source == "path":
            assert config.path is not None  # required by the config's validator for this source
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

        assert config.repo_id is not None  # required by the config's validator for this source
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
    text = text_config(hf_config)
    return {
        "architecture": (hf_config.get("architectures") or ["?"])[0],
        "num_hidden_layers": text.get("num_hidden_layers"),
        "hidden_size": text.get("hidden_size"),
        "vocab_size": text.get("vocab_size"),
        "parameters": count_parameters(directory),
    }
