"""config.pbtxt from plain Python data, and the schema check every written file goes through.

Configs are built as nested dicts/lists (see `render`) rather than from string templates, so no
`${...}` placeholder can survive. Every file is then parsed back with protobuf's `text_format`
into the `ModelConfig` message that ships with tritonclient: an unknown field, a misspelt enum or
a wrong type is a `BuildError` naming the file and line, found at build time instead of at
server start.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError

PLACEHOLDER = re.compile(r"\$\{[^}]*\}")
# Map fields of ModelConfig (and of its ensemble steps) are written as repeated key/value entries.
_MAP_FIELDS = {"parameters", "input_map", "output_map"}


@dataclass(frozen=True)
class Enum:
    """A protobuf enum value (written bare, e.g. TYPE_STRING, KIND_CPU)."""

    name: str


def render(config: dict[str, Any]) -> str:
    """Text format for a ModelConfig given as a dict; `parameters` values are plain strings."""
    lines: list[str] = []
    _render_fields(config, 0, lines)
    return "\n".join(lines) + "\n"


def _render_fields(message: dict[str, Any], depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    for key, value in message.items():
        if value is None:
            continue
        if key in _MAP_FIELDS:
            for map_key, map_value in value.items():
                entry = {"key": map_key,
                         "value": {"string_value": str(map_value)} if key == "parameters" else map_value}
                _render_message(key, entry, depth, lines)
        elif isinstance(value, dict):
            _render_message(key, value, depth, lines)
        elif isinstance(value, list):
            if value and all(isinstance(v, dict) for v in value):
                for item in value:
                    _render_message(key, item, depth, lines)
            else:
                lines.append(f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")


def _render_message(key: str, value: dict[str, Any], depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    lines.append(f"{pad}{key} {{")
    _render_fields(value, depth + 1, lines)
    lines.append(f"{pad}}}")


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | os.PathLike):
        return json.dumps(str(value))  # a JSON string is a valid text-format string literal
    raise TypeError(f"cannot write {type(value).__name__} into config.pbtxt")


def write_config(model_dir: Path, config: dict[str, Any], header: str = "") -> Path:
    """Write `<model_dir>/config.pbtxt` and check it parses; returns the path."""
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "config.pbtxt"
    text = "".join(f"# {line}\n" for line in header.splitlines()) + render(config)
    path.write_text(text)
    parse_config(path)
    return path


def parse_config(path: Path) -> Any:
    """Parse a config.pbtxt into tritonclient's ModelConfig; any failure is a BuildError."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    text = path.read_text()
    placeholder = PLACEHOLDER.search(text)
    if placeholder:
        line = text.count("\n", 0, placeholder.start()) + 1
        raise BuildError(f"unfilled template placeholder {placeholder.group(0)}", file=str(path), line=line,
                         fix="every parameter must be filled from the recipe")
    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        line = getattr(exc, "GetLine", lambda: None)()
        detail = str(exc).split(" : ", 1)[-1] if line else str(exc)
        raise BuildError(f"not a valid Triton ModelConfig: {detail}", file=str(path), line=line,
                         fix="see tritonclient's model_config.proto for the schema") from None
    return message


def check_repository(repo: Path, *, model_py_supplied_at_launch: frozenset[str] = frozenset()) -> list[str]:
    """Parse every config.pbtxt under `repo` and check the repository's shape; returns model names.

    Checks: each model's `name` equals its directory, a version directory exists, python models
    have their model.py (except those the launcher copies in from the container image), ensemble
    steps name models that are in the repository, and no file anywhere holds a `${...}` placeholder.
    """
    models: dict[str, Any] = {}
    for config_path in sorted(repo.glob("*/config.pbtxt")):
        message = parse_config(config_path)
        model_dir = config_path.parent
        if message.name and message.name != model_dir.name:
            raise BuildError(f"model name '{message.name}' differs from its directory '{model_dir.name}'",
                             file=str(config_path), fix="Triton requires them to be equal")
        versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        if not versions:
            raise BuildError("no version directory (e.g. 1/)", file=str(model_dir))
        if (message.backend == "python" and model_dir.name not in model_py_supplied_at_launch
                and not any((v / "model.py").is_file() for v in versions)):
            raise BuildError("python backend model without model.py", file=str(model_dir))
        models[model_dir.name] = message
    if not models:
        raise BuildError("no model (no */config.pbtxt)", file=str(repo))
    for name, message in models.items():
        for step in message.ensemble_scheduling.step:
            if step.model_name not in models:
                raise BuildError(f"ensemble step names model '{step.model_name}', not in the repository",
                                 file=str(repo / name / "config.pbtxt"))
    for file in sorted(repo.rglob("*")):
        if file.is_file() and file.suffix in (".pbtxt", ".yaml", ".yml", ".json", ".txt"):
            found = PLACEHOLDER.search(file.read_text(errors="replace"))
            if found:
                raise BuildError(f"unfilled template placeholder {found.group(0)}", file=str(file))
    return sorted(models)


def parameters_of(message: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in message.parameters.items()}
