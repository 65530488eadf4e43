"""Where trtbuild may write and delete: the recipe's output directory and the artifact cache, nothing else.

Every path is checked after resolving it (symlinks included), so neither `..` in a recipe value nor a
planted symlink can point a write or a delete somewhere else. The output directory carries a marker
file written by the first build; `clean` deletes only directories that carry it, and only the entries
a build creates there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from trtbuild.core.errors import UserError

# What a build writes into an output directory; `clean` removes these and nothing else.
OUTPUT_MARKER = ".trtbuild-output"
OUTPUT_ENTRIES = ("model", "quantize", "draft", "engine", "deploy", "build.json", "bench")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_inside(path: Path, root: Path) -> bool:
    """True when `path` (resolved, symlinks followed) is `root` or below it."""
    resolved, base = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return resolved == base or base in resolved.parents


def ensure_inside(path: Path, roots: list[Path], what: str) -> Path:
    """`path` itself (not resolved) when its resolved form lies under one of `roots`; else a UserError."""
    if any(is_inside(path, root) for root in roots):
        return path
    raise UserError(f"refusing to {what} {path}: it resolves to {os.path.realpath(path)}, outside "
                    f"{' and '.join(str(r) for r in roots)}",
                    fix="remove the symlink or `..` that leads there")


def check_name(value: str) -> str:
    """A recipe name becomes a directory name: letters, digits, `.`, `_`, `-`; no `/`, no `..`."""
    if not NAME_PATTERN.fullmatch(value) or set(value) == {"."}:
        raise ValueError(f"{value!r} is not a usable name: start with a letter or digit, then letters, digits, "
                         "'.', '_' or '-' (at most 128; no '/', no '..')")
    return value


def output_dir_problem(out: Path, recipe_file: Path, cache_root: Path) -> str | None:
    """Why `out` cannot be an output directory (None when it can): it must be a directory of its own,
    not the filesystem root, the home directory, the recipe's directory or any folder above it, and it
    must not overlap the cache."""
    resolved = Path(os.path.realpath(out))
    recipe_dir = Path(os.path.realpath(recipe_file)).parent
    home = Path(os.path.realpath(Path.home()))
    cache = Path(os.path.realpath(cache_root))
    if resolved == Path(resolved.anchor):
        return "is the filesystem root"
    if resolved == home:
        return "is the home directory"
    if resolved == recipe_dir or resolved in recipe_dir.parents:
        return f"holds the recipe itself ({recipe_dir})"
    if is_inside(resolved, cache) or is_inside(cache, resolved):
        return f"overlaps the artifact cache {cache}"
    return None


def mark_output_dir(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    marker = out / OUTPUT_MARKER
    if not marker.is_file():
        marker.write_text("This directory is written by trtbuild; `trtbuild clean` removes what it built here.\n")


def clean_output_dir(out: Path) -> list[str]:
    """Remove what a build wrote into `out` (its stage links, build.json, bench/) and `out` itself when
    nothing else is left. Refuses a directory without the marker (trtbuild did not make it)."""
    if not out.exists() and not out.is_symlink():
        return []
    if out.is_symlink() or not out.is_dir():
        raise UserError(f"{out} is not a directory trtbuild made (it is a symlink or a file)", field="output_dir",
                        fix="remove it yourself if it is yours")
    if not (out / OUTPUT_MARKER).is_file():
        raise UserError(f"{out} was not made by a trtbuild build (no {OUTPUT_MARKER} marker); nothing removed",
                        field="output_dir", fix="check output_dir / name; a directory built before markers existed is "
                        "marked by any build (a cached one too), or remove it yourself")
    removed = []
    for name in OUTPUT_ENTRIES:
        entry = out / name
        if entry.is_symlink() or entry.is_file():
            entry.unlink()
        elif entry.is_dir():
            ensure_inside(entry, [out], "delete")
            shutil.rmtree(entry)
        else:
            continue
        removed.append(name)
    for stray in out.glob(".*.link-*"):  # a killed build's half-made link
        if stray.is_symlink():
            stray.unlink()
    (out / OUTPUT_MARKER).unlink()
    with contextlib.suppress(OSError):  # files of the user's own stay, and so does the directory
        out.rmdir()
    return removed
