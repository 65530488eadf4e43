"""The stages, in pipeline order. Adding a stage: its package (trtbuild/<name>/config.py, stage.py), a
line in `all_stages`, its name in STAGE_ORDER (core/layout.py) and a field in app/recipe.py's Recipe."""

from __future__ import annotations

from functools import cache
from typing import Any

from trtbuild.core.layout import STAGE_ORDER
from trtbuild.core.stage import Stage
from trtbuild.deploy.stage import DeployStage
from trtbuild.draft.stage import DraftStage
from trtbuild.engine.stage import EngineStage
from trtbuild.model.stage import ModelStage
from trtbuild.quantize.stage import QuantizeStage
from trtbuild.runtime.bench import BenchConfig

__all__ = ["STAGE_ORDER", "all_stages", "get_stage", "extra_sections", "stage_names", "describe"]


BENCH_DOC = "`trtbuild bench`: plain vs speculative decoding on the same prompts."


@cache
def all_stages() -> tuple[Stage, ...]:
    stages: list[Stage] = [ModelStage(), QuantizeStage(), DraftStage(), EngineStage(), DeployStage()]
    return tuple(sorted(stages, key=lambda s: STAGE_ORDER.index(s.name)))


def get_stage(name: str) -> Stage:
    for stage in all_stages():
        if stage.name == name:
            return stage
    raise KeyError(name)


@cache
def extra_sections() -> dict[str, tuple[type, str]]:
    """Recipe sections that are not stages (name -> (config class, description))."""
    return {"bench": (BenchConfig, BENCH_DOC)}


def stage_names() -> list[str]:
    return [s.name for s in all_stages()]


def describe(stage: Stage) -> dict[str, Any]:
    return {"name": stage.name, "depends_on": list(stage.depends_on)}
