"""Recipes: YAML files validated by a schema composed of every stage's config.

Features: `extends:` (a path or a list, relative to the file that names it; later wins, maps merge
deeply, lists are replaced), `--set a.b=c` overrides (values parsed as YAML), `${env:NAME}` and
`${env:NAME:-default}` interpolation in strings (engine.env keeps them as references that the launch
scripts resolve, so secrets are never written anywhere). Relative paths inside a recipe are resolved
against the directory of the top-level recipe file (`Recipe.resolve_path`).
Every error is a one-line `UserError` naming the file, line and field, and the fix.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError

from trtbuild.app.stages import BENCH_DOC, STAGE_ORDER, extra_sections
from trtbuild.core.cache import default_root
from trtbuild.core.errors import UserError
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.safepaths import output_dir_problem
from trtbuild.core.shell import ENV_PATTERN
from trtbuild.core.yaml_positions import KeyPath, Position, closest_position, load_yaml_with_positions
from trtbuild.deploy.config import DeployConfig
from trtbuild.deploy.stage import DeployStage
from trtbuild.draft.config import DraftConfig
from trtbuild.draft.stage import DraftStage
from trtbuild.engine.config import EngineConfig
from trtbuild.engine.stage import EngineStage
from trtbuild.model.config import ModelConfig
from trtbuild.model.source import target_hf_config, uses_standin
from trtbuild.model.stage import ModelStage
from trtbuild.quantize.config import QuantizeConfig
from trtbuild.quantize.stage import QuantizeStage
from trtbuild.runtime.bench import BenchConfig


# The recipe schema: the top-level fields (RecipeInfo) and one optional section per stage, in pipeline
# order, then the sections that are not stages; each section's description is its stage's docstring.
# (A comment, not a docstring: pydantic would put a docstring into the published JSON schema.)
class Recipe(RecipeInfo):

    model: ModelConfig | None = Field(default=None, description=ModelStage.__doc__)
    quantize: QuantizeConfig | None = Field(default=None, description=QuantizeStage.__doc__)
    draft: DraftConfig | None = Field(default=None, description=DraftStage.__doc__)
    engine: EngineConfig | None = Field(default=None, description=EngineStage.__doc__)
    deploy: DeployConfig | None = Field(default=None, description=DeployStage.__doc__)
    bench: BenchConfig | None = Field(default=None, description=BENCH_DOC)

    def target_hf_config(self) -> tuple[dict[str, Any], str] | None:
        return target_hf_config(self)

    def uses_standin(self) -> bool:
        return uses_standin(self)


def load_recipe(path: str | os.PathLike[str], overrides: list[str] | None = None) -> Recipe:
    """Load, merge `extends`, apply `--set` overrides, interpolate env vars, validate."""
    recipe_path = Path(path)
    display = str(path)
    data, positions = _load_with_extends(recipe_path, display, chain=())
    for override in overrides or []:
        _apply_override(data, positions, override)
    data = _interpolate(data, (), positions)
    model = Recipe
    try:
        recipe = model.model_validate(data)
    except ValidationError as exc:
        raise _to_user_error(exc, positions, model, display) from None
    recipe._recipe_file = recipe_path.resolve()
    recipe._positions = positions
    _check_output_dir(recipe, display)
    return recipe


def _check_output_dir(recipe: Recipe, display: str) -> None:
    """The output directory is trtbuild's to fill and to clean: never a folder that holds other things."""

    problem = output_dir_problem(recipe.output_path, recipe.recipe_file, default_root())
    if problem is None:
        return
    key = ("output_dir",) if recipe.output_dir else ("name",)
    pos = recipe.position_of(key) or Position(display, None)
    raise UserError(f"the output directory {recipe.output_path} {problem}", file=pos.file, line=pos.line,
                    field="output_dir", fix="give output_dir a directory of its own, e.g. ../build/<name>")


def _refuse_empty_sections(data: dict, inherited: dict, positions: dict, display: str) -> None:
    """`model:` with nothing under it reads as null, which silently drops the stage. Null is only
    meaningful as `quantize: null` in a recipe that extends one with that section (drop it)."""

    for name in (*STAGE_ORDER, *extra_sections()):
        if name in data and data[name] is None and not isinstance(inherited.get(name), dict):
            pos = positions.get((name,)) or Position(display, None)
            raise UserError("the section is empty (null)", file=pos.file, line=pos.line, field=name,
                            fix=f"write `{name}: {{}}` for the defaults, or remove the line")


MAX_EXTENDS_DEPTH = 32  # recipes in one `extends` chain; deeper is a generated loop, not a recipe


def _load_with_extends(path: Path, display: str, chain: tuple[Path, ...]) -> tuple[dict, dict]:
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(p.name for p in (*chain, resolved))
        raise UserError(f"`extends` cycle: {cycle}", file=display, field="extends",
                        fix="remove one of the extends links")
    data, positions = load_yaml_with_positions(path, display)
    if data is None:
        raise UserError("the recipe is empty", file=display,
                        fix="write at least `name:` and a `model:` section")
    if not isinstance(data, dict):
        raise UserError(f"a recipe must be a YAML mapping, got a {type(data).__name__}", file=display,
                        line=1, fix="write `key: value` lines at the top level")
    parents = data.pop("extends", None)
    if parents is None:
        _refuse_empty_sections(data, {}, positions, display)
        return data, positions
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise UserError("`extends` must be a path or a list of paths", file=display,
                        line=positions[("extends",)].line, field="extends", fix="e.g. `extends: base.yaml`")
    merged: dict = {}
    merged_pos: dict[KeyPath, Position] = {}
    for i, parent in enumerate(parents):
        parent_path = path.parent / parent
        line = positions.get(("extends", i), positions[("extends",)]).line
        if not parent_path.is_file():
            raise UserError(f"extended recipe '{parent}' not found (looked in {parent_path.parent})",
                            file=display, line=line, field="extends",
                            fix="give a path relative to this file")
        if parent_path.resolve() in (*chain, resolved):
            cycle = " -> ".join(p.name for p in (*chain, resolved, parent_path.resolve()))
            raise UserError(f"`extends` cycle: {cycle}", file=display, line=line, field="extends",
                            fix="remove one of the extends links")
        if len(chain) + 1 >= MAX_EXTENDS_DEPTH:
            raise UserError(f"`extends` chains more than {MAX_EXTENDS_DEPTH} recipes deep (from "
                            f"{chain[0].name if chain else path.name})", file=display, line=line,
                            field="extends", fix="extend a recipe that holds the merged settings instead")
        parent_display = os.path.relpath(parent_path) if not Path(parent).is_absolute() else parent
        pdata, ppos = _load_with_extends(parent_path, parent_display, (*chain, resolved))
        _deep_merge(merged, merged_pos, pdata, ppos, ())
    _refuse_empty_sections(data, merged, positions, display)
    _deep_merge(merged, merged_pos, data, {k: v for k, v in positions.items() if k[:1] != ("extends",)}, ())
    return merged, merged_pos


def _deep_merge(base: dict, base_pos: dict, top: dict, top_pos: dict, prefix: KeyPath) -> None:
    for key, value in top.items():
        path = (*prefix, key)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], base_pos, value, top_pos, path)
            if path in top_pos:
                base_pos[path] = top_pos[path]
            continue
        base[key] = value
        for k in [k for k in base_pos if k[: len(path)] == path]:
            del base_pos[k]
        for k, v in top_pos.items():
            if k[: len(path)] == path:
                base_pos[k] = v


def _apply_override(data: dict, positions: dict, override: str) -> None:
    where = f"--set {override}"
    if "=" not in override:
        raise UserError("expected KEY=VALUE", file=where, fix="e.g. --set quantize.gate.max_perplexity_ratio=1.05")
    dotted, raw = override.split("=", 1)
    parts = dotted.strip().split(".")
    if not all(parts) or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts):
        raise UserError(f"'{dotted}' is not a dotted key path", file=where,
                        fix="use names joined by dots, e.g. draft.max_draft_len=4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise UserError(f"the value is not valid YAML: {problem}", file=where, field=dotted,
                        fix=f"quote it for YAML and the shell, e.g. --set '{dotted}=\"...\"'") from None
    except Exception as exc:  # noqa: BLE001  (a tag its constructor rejects: `!!int 1e3`, 5000 digits)
        reason = str(exc).split(";")[0].split("\n")[0][:120] or type(exc).__name__
        raise UserError(f"the value cannot be read: {reason}", file=where, field=dotted,
                        fix="give a plain value of the field's type") from None
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            prefix = ".".join(parts[: i + 1])
            raise UserError(f"'{prefix}' is a {type(child).__name__}, not a section, so '{dotted}' cannot be set",
                            file=where, field=dotted, fix=f"set {prefix} itself")
        node = child
    node[parts[-1]] = value
    path = tuple(parts)
    for k in [k for k in positions if k[: len(path)] == path]:
        del positions[k]
    positions[path] = Position(where, None)


def _interpolate(value: Any, path: KeyPath, positions: dict) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, (*path, k), positions) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, (*path, i), positions) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    if path[:2] == ("engine", "env") and len(path) == 3:
        # Kept as references and resolved by the launch scripts' shell: a secret such as HF_TOKEN
        # never lands in a manifest, bundle.json, a launch script or the cache key.
        if "${" in ENV_PATTERN.sub("", value):
            pos = closest_position(positions, path)
            raise UserError(f"unsupported interpolation in '{value}'", file=pos.file if pos else None,
                            line=pos.line if pos else None, field=_dotted(path),
                            fix="use ${env:NAME} or ${env:NAME:-default}")
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        pos = closest_position(positions, path)
        raise UserError(f"environment variable {name} is not set", file=pos.file if pos else None,
                        line=pos.line if pos else None, field=_dotted(path),
                        fix=f"export {name}=... or write ${{env:{name}:-default}}")

    result = ENV_PATTERN.sub(replace, value)
    if "${" in result:
        pos = closest_position(positions, path)
        raise UserError(f"unsupported interpolation in '{value}'", file=pos.file if pos else None,
                        line=pos.line if pos else None, field=_dotted(path),
                        fix="use ${env:NAME} or ${env:NAME:-default}")
    return result



def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _to_user_error(exc: ValidationError, positions: dict, model: type[BaseModel], display: str) -> UserError:
    err = exc.errors()[0]
    # Drop pydantic's union/tagged-union markers from the location.
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    pos = closest_position(positions, loc) or Position(display, None)
    kind = err["type"]
    field = _dotted(loc) or None
    given = err.get("input")
    if kind == "extra_forbidden":
        known = _fields_at(model, loc[:-1])
        guess = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean '{guess[0]}'?" if guess else f"known keys: {', '.join(sorted(known)) or 'none'}"
        return UserError(f"unknown key '{loc[-1]}'", file=pos.file, line=pos.line, field=field,
                         fix=f"remove it; {hint}")
    if kind == "missing":
        return UserError("required field is missing", file=pos.file, line=pos.line, field=field,
                         fix=f"add `{loc[-1]}:` to the section")
    message = err["msg"].removeprefix("Value error, ")
    if given is not None and not isinstance(given, dict | list):
        shown = repr(given)
        message += f" (got {shown if len(shown) <= 60 else shown[:40] + f'... ({len(shown)} characters)'})"
    fix = _fix_for(kind, err)
    return UserError(message, file=pos.file, line=pos.line, field=field, fix=fix)


def _fix_for(kind: str, err: Mapping[str, Any]) -> str:
    if kind == "literal_error":
        return f"use {err.get('ctx', {}).get('expected', 'one of the allowed values')}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"give a value of the right type ({kind.replace('_parsing', '').replace('_type', '')})"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return "give a value within the allowed range"
    if kind == "finite_number":
        return "give a finite number (not .inf or .nan)"
    if kind.startswith("string_") or kind.startswith("too_") or kind == "list_type":
        return "give a value of the allowed form"
    if kind == "value_error":
        return "see the message"
    return "see `trtbuild validate --help` and docs/recipe-reference.md"


def _fields_at(model: type[BaseModel], loc: KeyPath) -> list[str]:
    current: Any = model
    for part in loc:
        cls = _model_class(current)
        if cls is None or not isinstance(part, str) or part not in cls.model_fields:
            if cls is not None and isinstance(part, int):
                continue
            return []
        current = cls.model_fields[part].annotation
    cls = _model_class(current)
    return list(cls.model_fields) if cls else []


def _model_class(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        found = _model_class(arg)
        if found is not None:
            return found
    return None
