"""What a stage's work gets and gives, in core, below the sections and the app.

`StageConfig` is the base of every recipe section's config (each section's config.py:
trtbuild/draft/config.py, trtbuild/engine/config.py, ...); `StageContext` is what that work reads
(the recipe as `RecipeInfo`, finished input artifacts, a fresh output directory, progress) and
`StageResult` what it returns. The sections' stage modules and the pipeline import this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo


def reject_bool_number(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """`steps: true` is not 1: a YAML boolean given to a number field is an error, not a coercion."""
    if isinstance(value, bool) and info.field_name in model.model_fields:
        accepts = _scalar_types(model.model_fields[info.field_name].annotation)
        if bool not in accepts and accepts & {int, float}:
            raise ValueError(f"{str(value).lower()} is a boolean, not a number")
    return value


def _scalar_types(annotation: Any) -> set[type]:
    from typing import get_args

    args = get_args(annotation)
    if not args:
        return {annotation} if isinstance(annotation, type) else set()
    return {t for arg in args for t in _scalar_types(arg)}


class StageConfig(BaseModel):
    """Base of every stage's recipe section: unknown keys are errors, numbers are finite numbers."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_bool_number(cls, value, info)


@dataclass(frozen=True)
class Artifact:
    """A finished stage output in the cache."""

    stage: str
    key: str
    path: Path

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.path / "manifest.json").read_text())

    @property
    def metrics(self) -> dict[str, Any]:
        return self.manifest.get("metrics", {})


@dataclass
class StageContext:
    """What `run` gets: the whole recipe (for cross-stage reads), finished inputs, a fresh dir."""

    recipe: RecipeInfo
    inputs: dict[str, Artifact]  # stage name -> artifact, for each stage in `depends_on` that ran
    out_dir: Path  # empty temp dir; renamed into the cache only if run() returns
    progress: Progress = field(default_factory=Progress)

    def input(self, stage: str) -> Artifact:
        return self.inputs[stage]


@dataclass
class StageResult:
    """Metrics go into the manifest and the `--json` output; `info` into the manifest only."""

    metrics: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
