"""Where the target model comes from (the model stage's `model:` section) and what is read from it
before any build: its directory on this machine, its config.json or a stand-in's, the local HF cache,
and the refusals (pickle files, missing safetensors, remote code) every loaded directory goes through.

The model stage, the draft stage, the TensorRT-LLM checks and the GPU plan all read the target
through this module; it imports no stage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trtbuild.errors import UserError
from trtbuild.stage_api import StageConfig
from trtbuild.tiny import TinyModelConfig

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


def hub_snapshot_commit(repo_id: str, revision: str) -> str | None:
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
    commit = hub_snapshot_commit(repo_id, revision)
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
    data, _ = read_config(file)
    if data is None:
        return None
    return data, (str(file) if directory is not None else f"stand-in {file}")


def text_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The language model's section: `text_config` of multimodal configs (Llama 4), else the config."""
    text = hf_config.get("text_config")
    return text if isinstance(text, dict) else hf_config


def read_config(file: Path) -> tuple[dict[str, Any] | None, str | None]:
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
