"""Cross-stage checks run by `validate`, `plan` and `build` before any work.

Each stage may define `preflight(recipe) -> list[str]` returning one line per mismatch
(field, both values, the fix). All problems are collected; the first is raised as a UserError,
the others are appended so a user sees every mismatch at once.
"""

from __future__ import annotations

from typing import Any

from trtbuild.errors import UserError
from trtbuild.stages import all_stages


def problems(recipe: Any) -> list[str]:
    found: list[str] = []
    for stage in all_stages():
        config = recipe.stage_config(stage.name)
        check = getattr(stage, "preflight", None)
        if config is not None and check is not None:
            found.extend(check(config, recipe))
    return found


def preflight(recipe: Any) -> None:
    found = problems(recipe)
    if found:
        more = f" (+{len(found) - 1} more: {' | '.join(found[1:])})" if len(found) > 1 else ""
        raise UserError(found[0] + more, file=str(recipe.recipe_file.name))
