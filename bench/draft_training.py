"""What the draft benches share: a DraftConfig from a recipe's draft section plus `field=value`
overrides, and one training by the draft stage's own code (trtbuild.draft.build.train_draft)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from trtbuild.core.recipe_info import RecipeInfo


def draft_config(recipe: Path, overrides: list[str]) -> tuple[Any, dict[str, Any]]:
    """(DraftConfig, the parsed overrides): the recipe's draft section without source and gate."""
    from trtbuild.draft.stage import DraftConfig

    parsed: dict[str, Any] = {}
    for item in overrides:
        key, value = item.split("=", 1)
        parsed[key] = yaml.safe_load(value)
    section = yaml.safe_load(recipe.read_text())["draft"]
    fields = {k: v for k, v in section.items() if k not in ("source", "gate")}
    return DraftConfig(**{**fields, **parsed}), parsed


def eval_prompt_file(config: Any) -> str:
    """The chat .jsonl a bench measures tau on: the recipe's draft.eval.dataset, else the held-out requests."""
    return (config.eval.dataset.path if config.eval.dataset else None) or "chat_eval.jsonl"


def train(config: Any, target: Path, out: Path, base_dir: Path) -> dict[str, Any]:
    """Train into `out` (the draft in out/eagle3, the stage's train_log.json beside it); data paths
    of the config resolve against `base_dir`. Returns train_draft's metrics and info."""
    from trtbuild.core.progress import Progress
    from trtbuild.core.stage import StageContext
    from trtbuild.draft.build import train_draft

    def _Recipe() -> RecipeInfo:
        return RecipeInfo.standalone(base_dir)

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ctx = StageContext(recipe=_Recipe(), inputs={}, out_dir=out, progress=Progress())
    return train_draft(config, ctx, target, out / "eagle3", out.with_name(out.name + ".resume"))
