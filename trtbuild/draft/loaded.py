"""Where a loaded draft (`source: path` / `hub`) comes from: the directory, the local HF cache (never
downloaded), the refusal of pickles (a published pytorch_model.bin is converted, weights only), and
the target's directory when it exists before the build (for the compatibility check)."""

from __future__ import annotations

import shutil
from pathlib import Path

from trtbuild.core.cache import sha256_file
from trtbuild.core.errors import UserError
from trtbuild.core.hf_files import hub_snapshot_dir, pickle_files, refuse_pickles
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.draft.config import DraftConfig
from trtbuild.draft.pickled import PUBLISHED, check_archive, is_published_pickle_draft
from trtbuild.model.config import ModelConfig

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def hub_dir(config: DraftConfig) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    assert config.repo_id is not None  # required by the config's validator for this source
    try:
        return Path(snapshot_download(config.repo_id, revision=config.revision, local_files_only=True,
                                      allow_patterns=HUB_PATTERNS))
    except LocalEntryNotFoundError:
        raise UserError(f"draft '{config.repo_id}' ({config.revision}) is not in the local HF cache",
                        field="draft.repo_id",
                        fix=f"run `hf download {config.repo_id}` on a connected machine") from None


def pickled(directory: Path) -> bool:
    return is_published_pickle_draft(directory, pickle_files(directory))


def where(config: DraftConfig) -> str:
    return "draft.path" if config.source == "path" else "draft.repo_id"


def known_target_dir(recipe: RecipeInfo) -> Path | None:
    """The target's directory when it exists before the build (model.source path or hub)."""
    model = recipe.section(ModelConfig)
    if model is None or model.source not in ("path", "hub"):
        return None
    if model.source == "path":
        assert model.path is not None  # required by the config's validator for this source
        directory = recipe.resolve_path(model.path)
        return directory if (directory / "config.json").is_file() else None
    snapshot = hub_snapshot_dir(model.repo_id or "", model.revision)
    return snapshot if snapshot is not None and (snapshot / "config.json").is_file() else None


def copy_draft(source: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for file in sorted(source.iterdir()):
        if file.is_file() and not file.name.startswith("."):
            shutil.copyfile(file.resolve(), out / file.name)


def loaded_dir(config: DraftConfig, recipe: RecipeInfo) -> Path:
    if config.source == "path":
        assert config.path is not None  # required by the config's validator for this source
        directory = recipe.resolve_path(config.path)
        if not directory.is_dir():
            raise UserError(f"directory not found: {directory}", field="draft.path",
                            fix="give an existing EAGLE-3 draft directory")
    else:
        directory = hub_dir(config)
    check_pinned(directory, config.sha256)
    if is_published_pickle_draft(directory, pickle_files(directory)):
        check_archive(directory / PUBLISHED, where(config))
    else:
        refuse_pickles(directory, where(config))
    return directory


def check_pinned(directory: Path, pinned: dict[str, str]) -> None:
    """The recipe's `draft.sha256` pins, checked before anything reads the files: a shipped draft that a
    checkout, an LFS pointer or an edit changed is refused rather than served."""
    for name, expected in sorted(pinned.items()):
        file = directory / name
        if not file.is_file():
            raise UserError(f"{file} is missing (draft.sha256 pins it)", field="draft.sha256",
                            fix="restore the draft's files, or remove the pin")
        actual = sha256_file(file)
        if actual != expected:
            raise UserError(f"{file} has sha256 {actual[:16]}..., the recipe pins {expected[:16]}...",
                            field="draft.sha256",
                            fix="restore the draft's files (`git checkout` / `git lfs pull`), or pin the new "
                                "digest if the change is intended")
