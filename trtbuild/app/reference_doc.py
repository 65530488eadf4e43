"""The recipe reference (docs/recipe-reference.md), generated from the schema itself.

`trtbuild schema --markdown` prints it; a test checks the committed file is up to date and lists
every field, so the docs cannot drift from the code.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in get_args(annotation))
    if origin in (list, tuple, set, frozenset):
        args = get_args(annotation)
        inner = _type_name(args[0]) if args else "any"
        return f"list[{inner}]"
    if origin is dict:
        key, value = get_args(annotation) or (Any, Any)
        return f"map[{_type_name(key)}, {_type_name(value)}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
    else:
        return "**required**"
    if isinstance(value, BaseModel):
        return "(section defaults)"
    return "`" + json.dumps(value, default=str) + "`"


def _submodels(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found.extend(_submodels(arg))
    return found


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every field path of the schema, depth first (`quantize.gate.max_perplexity_ratio`)."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, field
        for sub in _submodels(field.annotation):
            yield from iter_fields(sub, path + ".")


def render(model: type[BaseModel]) -> str:
    lines = [
        "# Recipe reference",
        "",
        "Generated from the schema by `trtbuild schema --markdown`; do not edit by hand.",
        "Unknown keys are errors. Relative paths are relative to the recipe file.",
        "",
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    for path, field in iter_fields(model):
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
    return "\n".join(lines) + "\n"
