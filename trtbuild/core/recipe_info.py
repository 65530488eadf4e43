"""What every stage may know about the recipe beyond its own section: the top-level fields, where the
file is (paths resolve against it, errors name its lines), and typed access to the other sections.

`RecipeInfo` lives below the sections so they can take it without importing the app (trtbuild/app/
recipe.py), whose static `Recipe(RecipeInfo)` declares one typed field per section. A stage asks
`recipe.section(DraftConfig)` (peer config classes are pydantic only) and gets a `DraftConfig | None`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from trtbuild.core.safepaths import check_name
from trtbuild.core.yaml_positions import KeyPath, Position, closest_position

S = TypeVar("S", bound=BaseModel)

KNOWN_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a")


class RecipeInfo(BaseModel):
    """A recipe's top-level fields and where it was read from; trtbuild/app/recipe.py's `Recipe` adds the
    sections as typed fields, and `section(cls)` hands a stage the one of type `cls`."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    name: str = Field(description="Name of the recipe; used in the manifest and the default output dir.")
    description: str = Field(default="", description="Free text shown by `trtbuild plan`.")
    output_dir: str | None = Field(
        default=None,
        description="Where the final outputs are linked (relative to the recipe file). "
        "Default: build/<name> next to the recipe's directory.",
    )
    gpu_archs: list[str] = Field(
        default_factory=lambda: ["sm_90a", "sm_100a"],
        description="GPU architectures the deployment targets (kernels are compiled for each).",
    )

    @field_validator("name")
    @classmethod
    def _usable_name(cls, value: str) -> str:
        return check_name(value)

    @field_validator("gpu_archs")
    @classmethod
    def _known_archs(cls, archs: list[str]) -> list[str]:
        unknown = [a for a in archs if a not in KNOWN_ARCHS]
        if unknown:
            raise ValueError(f"unknown GPU arch {unknown[0]!r}; known: {', '.join(KNOWN_ARCHS)}")
        return archs

    _recipe_file: Path = PrivateAttr(default=Path("recipe.yaml"))
    _positions: dict[KeyPath, Position] = PrivateAttr(default_factory=dict)

    @classmethod
    def standalone(cls, base_dir: str | os.PathLike[str] = ".", name: str = "standalone") -> RecipeInfo:
        """A recipe without sections whose relative paths resolve against `base_dir`: what a stage's
        work gets when it runs on its own (tests, bench scripts), outside a loaded recipe."""
        recipe = cls(name=name)
        recipe._recipe_file = Path(base_dir).resolve() / "recipe.yaml"
        return recipe

    @property
    def recipe_file(self) -> Path:
        return self._recipe_file

    @property
    def base_dir(self) -> Path:
        return self._recipe_file.parent

    def resolve_path(self, value: str | os.PathLike[str]) -> Path:
        path = Path(os.path.expanduser(str(value)))
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    @property
    def output_path(self) -> Path:
        if self.output_dir:
            return self.resolve_path(self.output_dir)
        return (self.base_dir.parent / "build" / self.name).resolve()

    def position_of(self, path: KeyPath) -> Position | None:
        return closest_position(self._positions, path)

    def stage_config(self, name: str) -> Any:
        """The section called `name` (None when the recipe has none): for code that walks every stage
        by name (the pipeline, preflight). Code that reads one section asks `section(ItsConfig)`."""
        return getattr(self, name, None)

    def section(self, cls: type[S]) -> S | None:
        """The recipe's section of type `cls`, typed: `recipe.section(DraftConfig).max_draft_len` is
        checked by mypy, where `getattr(recipe.draft, "max_draft_len", None)` would hide a renamed field."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if type(value) is cls:
                return value
        return None

    def target_hf_config(self) -> tuple[dict[str, Any], str] | None:
        """The target's config.json (or its stand-in's) and where it was read, None before the model
        stage has made it; read before any build. The model section knows how: trtbuild/app/recipe.py's
        `Recipe` answers through trtbuild/model/source.py, so no other section imports the model's work."""
        return None

    def uses_standin(self) -> bool:
        """The target's shapes come from a stand-in config.json (its weights are not on this machine)."""
        return False
