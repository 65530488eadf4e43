"""Hugging Face files read without importing huggingface_hub or transformers: the local HF cache, a
config.json and its language-model section, and the refusal of pickle files. Every section that looks
at a target directory (model, draft, the engine's checks, the app's plan) uses these.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError


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
