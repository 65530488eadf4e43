"""Where the target model comes from (the model stage's `model:` section) and what is read from it
before any build: its directory on this machine, its config.json or a stand-in's, the local HF cache,
and the refusals (pickle files, missing safetensors, remote code) every loaded directory goes through.

The model stage, the draft stage, the TensorRT-LLM checks and the GPU plan all read the target
through this module; it imports no stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError
from trtbuild.core.hf_files import (  # noqa: F401  (the model section's readers of the target)
    PICKLE_SUFFIXES,
    hf_cache_dir,
    hub_snapshot_commit,
    hub_snapshot_dir,
    pickle_files,
    read_config,
    refuse_pickles,
    text_config,
)
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.model import gguf
from trtbuild.model.config import STANDIN_KEYS, ModelConfig


def local_model_dir(config: ModelConfig, recipe: RecipeInfo) -> Path | None:
    """The target's directory on this machine (source path, or the hub snapshot) when its config.json
    is there; None for the tiny target (built, not found) and for weights that are absent."""
    if config.source == "path" and config.path:
        directory: Path | None = recipe.resolve_path(config.path)
    elif config.source == "hub" and config.repo_id:
        directory = hub_snapshot_dir(config.repo_id, config.revision)
    else:
        return None
    return directory if directory is not None and (directory / "config.json").is_file() else None


def standin_path(config: ModelConfig, recipe: RecipeInfo) -> Path | None:
    return recipe.resolve_path(config.standin_config) if config.standin_config else None


def uses_standin(recipe: RecipeInfo) -> bool:
    """True when the recipe's target is absent here and a stand-in config speaks for it."""
    config = recipe.section(ModelConfig)
    return (config is not None and config.source in ("path", "hub") and bool(config.standin_config)
            and local_model_dir(config, recipe) is None)


def target_hf_config(recipe: RecipeInfo) -> tuple[dict[str, Any], str] | None:
    """The target's config.json and where it was read: the real one when it is on this machine, else
    the stand-in's. None for the tiny target and when neither is readable (preflight says why)."""
    config = recipe.section(ModelConfig)
    if config is None:
        return None
    if config.source == "gguf":
        try:
            gguf_file = gguf.locate(config, recipe)
        except UserError:
            return None  # preflight says what is missing
        return gguf.metadata_config(gguf_file), f"GGUF metadata {gguf_file}"
    directory = local_model_dir(config, recipe)
    file = directory / "config.json" if directory is not None else standin_path(config, recipe)
    if file is None:
        return None
    data, _ = read_config(file)
    if data is None:
        return None
    return data, (str(file) if directory is not None else f"stand-in {file}")



def standin_problems(config: ModelConfig, recipe: RecipeInfo, real: dict[str, Any] | None) -> list[str]:
    """The stand-in must exist, carry the shape keys and, once the weights are here, match them."""
    file = standin_path(config, recipe)
    if file is None:
        return []
    data, error = read_config(file)
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



def check_hf_directory(directory: Path, config: ModelConfig, where: str) -> dict[str, Any]:
    """Refuse what we cannot or must not load; return config.json."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise UserError(f"{directory} has no config.json", field=where,
                        fix="point at a Hugging Face model directory")
    hf_config, error = read_config(config_file)
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
