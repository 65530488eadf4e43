"""The stages, in pipeline order. Adding a stage = a module here + one line in `all_stages`."""

from __future__ import annotations

from functools import cache
from typing import Any

from trtbuild.layout import STAGE_ORDER
from trtbuild.stages.base import Stage

__all__ = ["STAGE_ORDER", "all_stages", "get_stage", "extra_sections", "stage_names", "describe"]


@cache
def all_stages() -> tuple[Stage, ...]:
    from trtbuild.stages.deploy import DeployStage
    from trtbuild.stages.draft import DraftStage
    from trtbuild.stages.engine import EngineStage
    from trtbuild.stages.model import ModelStage
    from trtbuild.stages.quantize import QuantizeStage

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
    from trtbuild.runtime.bench import BenchConfig

    return {"bench": (BenchConfig, "`trtbuild bench`: plain vs speculative decoding on the same prompts.")}


def stage_names() -> list[str]:
    return [s.name for s in all_stages()]


def describe(stage: Stage) -> dict[str, Any]:
    return {"name": stage.name, "depends_on": list(stage.depends_on)}
