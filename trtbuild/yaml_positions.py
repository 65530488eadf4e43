"""YAML loading that remembers where every value came from (file and line), for error messages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtbuild.errors import UserError

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    file: str
    line: int | None  # 1-based; None for values that came from the command line

    def describe(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


def load_yaml_with_positions(path: Path, display: str) -> tuple[Any, dict[KeyPath, Position]]:
    """Parse one YAML file; return the data and a map from key path to where it was written."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise UserError("file not found", file=display, fix="check the path") from exc
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read as a UTF-8 text file ({type(exc).__name__})", file=display,
                        fix="point at a YAML recipe file") from exc
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        positions: dict[KeyPath, Position] = {}
        data = _convert(loader, node, (), positions, display) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise UserError(f"not valid YAML: {problem}", file=display, line=line,
                        fix="fix the YAML syntax at that line") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"not valid YAML: {exc}", file=display, fix="fix the YAML syntax") from exc
    finally:
        loader.dispose()
    return data, positions


def _convert(loader: yaml.SafeLoader, node: yaml.Node, path: KeyPath,
             positions: dict[KeyPath, Position], display: str) -> Any:
    positions[path] = Position(display, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise UserError(f"mapping keys must be strings, got {key!r}", file=display,
                                line=key_node.start_mark.line + 1, fix="quote the key")
            if key in result:
                raise UserError(f"key '{key}' appears twice", file=display,
                                line=key_node.start_mark.line + 1, fix="keep one of them")
            result[key] = _convert(loader, value_node, (*path, key), positions, display)
            # Point at the key's line, not the value's (a nested mapping starts on the next line).
            positions[(*path, key)] = Position(display, key_node.start_mark.line + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, (*path, i), positions, display) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)
