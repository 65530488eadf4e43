"""Cross-stage checks run by `validate`, `plan` and `build` before any work.

Each stage's `preflight(config, recipe) -> list[str]` (declared on trtbuild.core.stage.Stage), and
trtbuild.app.crosschecks adds the rules that span sections; every problem is one line
`field: message (fix: ...)`. All problems are collected; the first is raised as a UserError at the
file and line where its field is written (the field's section, or the recipe's first line, when the
field itself is not written), the others are appended so a user sees every mismatch at once.
"""

from __future__ import annotations

import re

from trtbuild.app import crosschecks, validate_data
from trtbuild.app.recipe import Recipe
from trtbuild.app.recipe_conformance import contract_problems
from trtbuild.app.stages import all_stages
from trtbuild.core.errors import UserError
from trtbuild.engine.checks import engine_problems, toolchain_problems
from trtbuild.engine.config import EngineConfig

_FIELD = re.compile(r"([A-Za-z_]\w*(?:\.\w+)*)(?:\[\d+\])?: ")


def problems(recipe: Recipe) -> list[str]:
    found: list[str] = []
    for stage in all_stages():
        config = recipe.stage_config(stage.name)
        if isinstance(config, EngineConfig):
            # The engine's own checks, then (only for a consistent engine section) the bundle it
            # renders against its release, which spans the engine and deploy sections.
            own = engine_problems(config, recipe)
            found.extend(own + ([] if own else contract_problems(config, recipe)) + toolchain_problems(config))
        elif config is not None:
            found.extend(stage.preflight(config, recipe))
    found.extend(p for p in crosschecks.problems(recipe) if p not in found)
    found.extend(p for p in validate_data.problems(recipe) if p not in found)
    return found


def preflight(recipe: Recipe) -> None:
    found = problems(recipe)
    if found:
        more = f" (+{len(found) - 1} more: {' | '.join(found[1:])})" if len(found) > 1 else ""
        raise located(recipe, found[0], more)


def located(recipe: Recipe, problem: str, more: str = "") -> UserError:
    """The problem as a UserError at the recipe position of the field it names."""
    match = _FIELD.match(problem)
    field = match.group(1) if match else None
    message = problem[match.end():] if match else problem
    pos = recipe.position_of(tuple(field.split("."))) if field else recipe.position_of(())
    file = pos.file if pos else str(recipe.recipe_file)
    return UserError(message + more, file=file, line=pos.line if pos else None, field=field)
