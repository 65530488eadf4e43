"""The content-addressed artifact store: one place owns the cache layout and the manifests.

Layout: `<root>/<stage>/<key>/` holds a finished artifact and its `manifest.json`. Work happens
in `<root>/<stage>/.tmp-<key>-<pid>-<nonce>/` and is renamed into place only after the manifest is
written, so a killed build never leaves an entry that looks complete: a directory named by a bare
key exists only if its rename happened, and the rename is the last step.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_TMP_PREFIX = ".tmp-"


def default_root() -> Path:
    if os.environ.get("TRTBUILD_CACHE"):
        return Path(os.environ["TRTBUILD_CACHE"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "trtbuild"


@dataclass(frozen=True)
class Entry:
    stage: str
    key: str
    path: Path

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.path / MANIFEST).read_text())


class ArtifactCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_root()).resolve()

    def entry_path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> Entry | None:
        path = self.entry_path(stage, key)
        if (path / MANIFEST).is_file():
            return Entry(stage, key, path)
        return None

    @contextlib.contextmanager
    def lock(self, stage: str, key: str) -> Iterator[None]:
        """Serialise builds of one key across processes (a second build waits, then finds it cached)."""
        lock_dir = self.root / stage
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / f".{key}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def new_workdir(self, stage: str, key: str) -> Path:
        path = self.root / stage / f"{_TMP_PREFIX}{key}-{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir(parents=True)
        return path

    def commit(self, workdir: Path, stage: str, key: str, manifest: dict[str, Any]) -> Entry:
        """Hash the files, write the manifest, then rename the workdir into place (the last step)."""
        manifest = dict(manifest)
        manifest["files"] = hash_tree(workdir)
        _write_json_durably(workdir / MANIFEST, manifest)
        _fsync_dir(workdir)
        final = self.entry_path(stage, key)
        if final.exists():  # --force over an existing entry: move it aside, then drop it
            trash = final.with_name(f"{_TMP_PREFIX}old-{key}-{secrets.token_hex(4)}")
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(workdir, final)
        _fsync_dir(final.parent)
        return Entry(stage, key, final)

    def discard(self, workdir: Path) -> None:
        shutil.rmtree(workdir, ignore_errors=True)

    def entries(self) -> list[Entry]:
        found = []
        if not self.root.is_dir():
            return found
        for stage_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for path in sorted(stage_dir.iterdir()):
                if path.is_dir() and not path.name.startswith(".") and (path / MANIFEST).is_file():
                    found.append(Entry(stage_dir.name, path.name, path))
        return found

    def incomplete(self) -> list[Path]:
        """Temp dirs whose owning process is gone (killed builds)."""
        leftovers = []
        if not self.root.is_dir():
            return leftovers
        for stage_dir in self.root.iterdir():
            if not stage_dir.is_dir():
                continue
            for path in stage_dir.glob(f"{_TMP_PREFIX}*"):
                pid = _owner_pid(path.name)
                if pid is None or not _alive(pid):
                    leftovers.append(path)
        return leftovers

    def touch(self, entry: Entry) -> None:
        """Record use, for `cache gc --older-than`."""
        (entry.path / ".last_used").write_text(str(time.time()))

    def last_used(self, entry: Entry) -> float:
        marker = entry.path / ".last_used"
        try:
            return float(marker.read_text())
        except (OSError, ValueError):
            return (entry.path / MANIFEST).stat().st_mtime

    def remove(self, entry: Entry) -> None:
        trash = entry.path.with_name(f"{_TMP_PREFIX}gc-{entry.key}-{secrets.token_hex(4)}")
        os.rename(entry.path, trash)  # vanish atomically first, then delete at leisure
        shutil.rmtree(trash, ignore_errors=True)


def _owner_pid(name: str) -> int | None:
    parts = name[len(_TMP_PREFIX):].split("-")
    if len(parts) >= 3 and parts[-2].isdigit():
        return int(parts[-2])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def hash_tree(directory: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file; symlinks to outside (a linked local model) are recorded, not read."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        if path.is_symlink():
            files[rel] = {"symlink": os.readlink(path)}
            continue
        if path.is_file() and not any(part.is_symlink() for part in path.parents if directory in part.parents):
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            files[rel] = {"sha256": digest.hexdigest(), "size": path.stat().st_size}
    return files


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _write_json_durably(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".partial")
    with tmp.open("w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
