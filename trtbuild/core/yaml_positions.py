"""YAML loading that remembers where every value came from (file and line), for error messages.

Bounded: regular files only (a FIFO or /dev/zero is refused before anything is read), at most
MAX_BYTES, no NUL bytes, nesting at most MAX_DEPTH (checked on the event stream, before any
recursion), and at most MAX_VALUES values after alias expansion (a 600-byte "billion laughs" file
is refused at once instead of expanding without bound). A scalar that its tag cannot build
(`!!int 1e3`, `!!float abc`, a bad `!!timestamp`, an integer of more digits than Python converts)
and a tag on a mapping or list (`!!set`, `!!omap`: its meaning would be dropped) are one-line errors
naming the file, the line and the field.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtbuild.core.errors import UserError

KeyPath = tuple[str | int, ...]
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_VALUES = 100_000
_PLAIN_TAGS = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}


@dataclass(frozen=True)
class Position:
    file: str
    line: int | None  # 1-based; None for values that came from the command line

    def describe(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


def read_recipe_text(path: Path, display: str) -> str:
    """The file's text, refusing what is not a small regular UTF-8 text file without NUL bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except FileNotFoundError as exc:
        raise UserError("file not found", file=display, fix="check the path") from exc
    except IsADirectoryError as exc:
        raise UserError("is a directory, not a recipe file", file=display, fix="point at a YAML recipe file") from exc
    except OSError as exc:
        raise UserError(f"cannot open: {exc.strerror}", file=display, fix="check the path and permissions") from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UserError("is a directory, not a recipe file", file=display, fix="point at a YAML recipe file")
        if not stat.S_ISREG(info.st_mode):
            raise UserError("is not a regular file (a device, FIFO or socket)", file=display,
                            fix="point at a YAML recipe file")
        if info.st_size > MAX_BYTES:
            raise UserError(f"is {info.st_size} bytes; a recipe may have at most {MAX_BYTES}", file=display,
                            fix="split it with `extends:` or remove what is not needed")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise UserError(f"has more than {MAX_BYTES} bytes", file=display, fix="shorten the recipe")
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise UserError("holds a NUL byte", file=display, line=line, fix="save the recipe as plain UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError("is not UTF-8 text", file=display, line=line, fix="save the recipe as UTF-8") from exc


def load_yaml_with_positions(path: Path, display: str) -> tuple[Any, dict[KeyPath, Position]]:
    """Parse one YAML file; return the data and a map from key path to where it was written."""
    text = read_recipe_text(path, display)
    loader: yaml.SafeLoader | None = None
    try:
        _check_depth(text, display)
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        positions: dict[KeyPath, Position] = {}
        budget = [MAX_VALUES]
        data = _convert(loader, node, (), positions, display, budget) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise UserError(f"not valid YAML: {problem}", file=display, line=line,
                        fix="fix the YAML syntax at that line") from exc
    except yaml.YAMLError as exc:
        message = str(exc).split("\n")[0]
        raise UserError(f"not valid YAML: {message}", file=display, line=_line_of(exc, text),
                        fix="fix the YAML syntax") from exc
    finally:
        if loader is not None:
            loader.dispose()
    return data, positions


def _line_of(exc: yaml.YAMLError, text: str) -> int | None:
    position = getattr(exc, "position", None)  # a ReaderError's character offset
    return None if position is None else text[:position].count("\n") + 1


def _check_depth(text: str, display: str) -> None:
    """Walk the event stream (iterative, unlike the composer) and refuse deep nesting."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise UserError(f"nested more than {MAX_DEPTH} levels deep", file=display,
                                line=event.start_mark.line + 1, fix="flatten the recipe")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _convert(loader: yaml.SafeLoader, node: yaml.Node, path: KeyPath,
             positions: dict[KeyPath, Position], display: str, budget: list[int]) -> Any:
    if len(path) > MAX_DEPTH:  # aliases can nest deeper than the text does (`&a [*a]` never ends)
        raise UserError(f"nested more than {MAX_DEPTH} levels deep (through aliases)", file=display,
                        line=node.start_mark.line + 1, fix="flatten the recipe; an alias may not contain itself")
    budget[0] -= 1
    if budget[0] < 0:
        raise UserError(f"expands to more than {MAX_VALUES} values (aliases used over and over?)", file=display,
                        line=node.start_mark.line + 1, fix="write the values out instead of nesting aliases")
    positions[path] = Position(display, node.start_mark.line + 1)
    plain = _PLAIN_TAGS.get(type(node))
    if plain is not None and node.tag != plain:
        kind = "mapping" if isinstance(node, yaml.MappingNode) else "list"
        raise UserError(f"the tag {_short_tag(node.tag)} on a {kind} is not supported", file=display,
                        line=node.start_mark.line + 1, field=dotted(path) or None,
                        fix=f"remove the tag; write a plain YAML {kind}")
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(loader, key_node, path, display)
            if not isinstance(key, str):
                raise UserError(f"mapping keys must be strings, got {key!r}", file=display,
                                line=key_node.start_mark.line + 1, fix="quote the key")
            if key in result:
                raise UserError(f"key '{key}' appears twice", file=display,
                                line=key_node.start_mark.line + 1, fix="keep one of them")
            result[key] = _convert(loader, value_node, (*path, key), positions, display, budget)
            # Point at the key's line, not the value's (a nested mapping starts on the next line).
            positions[(*path, key)] = Position(display, key_node.start_mark.line + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, (*path, i), positions, display, budget) for i, item in enumerate(node.value)]
    return _scalar(loader, node, path, display)


def _scalar(loader: yaml.SafeLoader, node: yaml.Node, path: KeyPath, display: str) -> Any:
    """The node's value; a value its tag cannot build is one line, never a traceback."""
    if not isinstance(node, yaml.ScalarNode):  # a collection used as a mapping key
        raise UserError("mapping keys must be plain scalars", file=display, line=node.start_mark.line + 1,
                        field=dotted(path) or None, fix="quote the key")
    try:
        return loader.construct_object(node, deep=True)
    except yaml.MarkedYAMLError:
        raise  # reported with its line by load_yaml_with_positions
    except Exception as exc:  # noqa: BLE001  (int(), float(), datetime() of what the tag names)
        reason = str(exc).split(";")[0].split("\n")[0][:120] or type(exc).__name__
        shown = node.value if len(node.value) <= 40 else node.value[:20] + f"... ({len(node.value)} characters)"
        raise UserError(f"{shown!r} is not a valid {_short_tag(node.tag)} value: {reason}", file=display,
                        line=node.start_mark.line + 1, field=dotted(path) or None,
                        fix="write a plain value of the field's type (quote it if it is text)") from None


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def dotted(path: KeyPath) -> str:
    """`a.b[2].c` for the key path (a, b, 2, c)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def closest_position(positions: dict[KeyPath, Position], path: KeyPath) -> Position | None:
    """The position of `path`, or of its nearest ancestor that has one."""
    for n in range(len(path), -1, -1):
        if path[:n] in positions:
            return positions[path[:n]]
    return None
