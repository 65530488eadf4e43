"""The content-addressed artifact store: one place owns the cache layout and the manifests.

Layout: `<root>/<stage>/<key>/` holds a finished artifact and its `manifest.json`. Work happens
in `<root>/<stage>/.tmp-<key>-<pid>-<nonce>/` and is renamed into place only after the manifest is
written, so a killed build never leaves an entry that looks complete: a directory named by a bare
key exists only if its rename happened, and the rename is the last step.

Upkeep: a hit is verified against the manifest's file hashes before reuse (files whose size, mtime,
inode and ctime are unchanged since their last check are not hashed again; `cache verify` hashes all),
and a damaged entry is rebuilt;
every use touches `.last_used` for `cache gc`; an entry whose manifest is unreadable is reported and
skipped, never crashed on. Interrupted draft trainings keep their checkpoints in `<root>/resume/`.

Safety of upkeep (`cache gc`, `clean --cache`): the root carries MARKER, written when trtbuild
creates the cache (or first writes into an empty one, or one that has only the layout above: a cache
of an older trtbuild); removal happens only in a marked root, only in the stage directories trtbuild
names, never through a symlink, and never of an entry a running server holds a lease on (`lease`:
a shared flock on the entry's `.in-use`; removal takes it exclusively, so the two cannot interleave).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError
from trtbuild.core.layout import SHARD_SETS, STAGE_ORDER

MANIFEST = "manifest.json"
_TMP_PREFIX = ".tmp-"
LAST_USED = ".last_used"
VERIFIED = ".verified"  # {file: [size, mtime_ns, inode, ctime_ns]} as of the last hash check
RESUME = "resume"
_IN_USE = ".in-use"
MARKER = ".trtbuild-cache"  # "this directory is a trtbuild artifact cache": gc and clean act only here
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


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

    def manifest_or_none(self) -> dict[str, Any] | None:
        """The manifest, or None when it is unreadable (truncated, not JSON, not an object)."""
        try:
            data = self.manifest()
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def _stage_dir_names() -> tuple[str, ...]:
    """The stage directories and the draft's shard sets (trtbuild/draft/shards.py): entries alike."""
    return (*STAGE_ORDER, *SHARD_SETS)


class ArtifactCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_root()).resolve()

    # -- the marker: "trtbuild made this directory" -------------------------------------------
    def is_marked(self) -> bool:
        return _is_plain_file(self.root / MARKER)

    def _prepare_root(self) -> None:
        """Create the root if needed, marking it when trtbuild may call it its own (see `unmarked_reason`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.is_marked() and self.unmarked_reason() is None:
            self._write_marker()

    def _write_marker(self) -> None:
        with contextlib.suppress(OSError):  # a read-only cache still builds; gc then refuses
            fd = os.open(self.root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as handle:
                handle.write("trtbuild artifact cache: `trtbuild cache gc` and `clean --cache` act here\n")

    def unmarked_reason(self) -> str | None:
        """None when the unmarked root holds only what trtbuild writes (nothing, or the layout of an
        older trtbuild's cache); else why trtbuild must not call it its own (the first stranger found)."""
        stages = _stage_dir_names()
        try:
            children = list(os.scandir(self.root))
        except OSError as exc:
            return f"it cannot be read ({exc.strerror})"
        for child in children:
            if child.name == MARKER:
                continue
            if child.is_symlink() or not child.is_dir(follow_symlinks=False):
                return f"it holds {child.name!r}, which is not a directory trtbuild writes there"
            if child.name == RESUME:
                continue
            if child.name not in stages:
                return f"it holds {child.name!r}, which is not a stage directory of trtbuild"
            for item in os.scandir(child.path):
                if item.is_symlink():
                    return f"{child.name}/{item.name} is a symlink, which trtbuild never writes there"
                if item.is_dir(follow_symlinks=False):
                    if item.name.startswith(_TMP_PREFIX) or _is_plain_file(Path(item.path) / MANIFEST):
                        continue
                    return f"{child.name}/{item.name} is not a cache entry (no manifest.json)"
                if not (item.name.startswith(".") and item.name.endswith(".lock")):
                    return f"{child.name}/{item.name} is not a file trtbuild writes there"
        return None

    def require_marked(self, action: str) -> None:
        """Refuse `action` (one line, exit 2) unless the root is a trtbuild cache; an unmarked one that
        has only a trtbuild cache's layout is marked now (a cache made before the marker existed)."""
        if self.is_marked():
            return
        if self.root.is_symlink() or not self.root.is_dir():
            raise UserError(f"{self.root} is not a directory, so there is no trtbuild cache there; nothing to {action}",
                            fix="point TRTBUILD_CACHE at the directory trtbuild builds into")
        reason = self.unmarked_reason()
        if reason is not None:
            raise UserError(f"{self.root} is not a trtbuild cache (no {MARKER} marker, and {reason}); nothing "
                            f"was removed", fix="point TRTBUILD_CACHE at the directory trtbuild builds into")
        self._write_marker()

    def entry_path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> Entry | None:
        """The finished entry, or None (also when its manifest is unreadable: it is rebuilt)."""
        path = self.entry_path(stage, key)
        if (path / MANIFEST).is_file():
            entry = Entry(stage, key, path)
            return entry if entry.manifest_or_none() is not None else None
        return None

    def damage(self, entry: Entry, *, record: bool = False, full: bool = False) -> str | None:
        """What differs from the manifest's file list (first problem), or None when the entry is intact.
        Files unchanged (size, mtime, inode, ctime) since their last check are not hashed again: any
        write changes the ctime, and setting the mtime back changes it too, which nobody can set back
        (only damage that bypasses the file system, bit rot, goes unseen: `full` hashes every file, as
        `cache verify` does). `record` saves this check's result so the next one is cheap (plan passes
        False: it touches nothing)."""
        manifest = entry.manifest_or_none()
        if manifest is None:
            return "manifest.json is unreadable"
        expected = manifest.get("files")
        if not isinstance(expected, dict):
            return "manifest.json lists no files"
        seen = {} if full else _read_json(entry.path / VERIFIED) or {}
        checked: dict[str, list[int]] = {}
        for rel, want in expected.items():
            path = entry.path / rel
            if "symlink" in want:
                if not path.is_symlink() or os.readlink(path) != want["symlink"]:
                    return f"{rel}: the link is gone or points elsewhere"
                continue
            try:
                st = path.lstat()
            except OSError:
                return f"{rel}: missing"
            if path.is_symlink() or st.st_size != want.get("size"):
                return f"{rel}: {st.st_size} bytes, the manifest says {want.get('size')}"
            stamp = _stamp(st)
            if seen.get(rel) != stamp and sha256_file(path) != want.get("sha256"):
                return f"{rel}: content differs from its sha256 in the manifest"
            checked[rel] = stamp
        if record and checked != seen:
            with contextlib.suppress(OSError):
                _write_json_durably(entry.path / VERIFIED, checked)
        return None

    @contextlib.contextmanager
    def lock(self, stage: str, key: str) -> Iterator[None]:
        """Serialise builds of one key across processes (a second build waits, then finds it cached)."""
        self._prepare_root()
        lock_dir = self.root / stage
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / f".{key}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def new_workdir(self, stage: str, key: str) -> Path:
        self._prepare_root()
        path = self.root / stage / f"{_TMP_PREFIX}{key}-{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir(parents=True)
        return path

    def commit(self, workdir: Path, stage: str, key: str, manifest: dict[str, Any]) -> Entry:
        """Hash the files, write the manifest, then rename the workdir into place (the last step)."""
        manifest = dict(manifest)
        manifest["files"] = hash_tree(workdir)
        _write_json_durably(workdir / MANIFEST, manifest)
        # Just hashed: the first reuse need not hash them again (a rename keeps size, mtime, inode).
        _write_json_durably(workdir / VERIFIED, _stamps(workdir, manifest["files"]))
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

    def _stage_dirs(self) -> list[Path]:
        """The stage directories trtbuild writes (real directories, never symlinks), in stage order."""
        return [self.root / name for name in _stage_dir_names() if _is_real_dir(self.root / name)]

    def entries(self) -> list[Entry]:
        """Every finished entry, those with an unreadable manifest included (see manifest_or_none)."""
        found = []
        for stage_dir in self._stage_dirs():
            for path in sorted(stage_dir.iterdir()):
                if not path.name.startswith(".") and _is_real_dir(path) and _is_plain_file(path / MANIFEST):
                    found.append(Entry(stage_dir.name, path.name, path))
        return found

    def incomplete(self) -> list[Path]:
        """Temp dirs whose owning process is gone (killed builds)."""
        leftovers = []
        for stage_dir in self._stage_dirs():
            for path in stage_dir.glob(f"{_TMP_PREFIX}*"):
                pid = _owner_pid(path.name)
                if _is_real_dir(path) and (pid is None or not _alive(pid)):
                    leftovers.append(path)
        return leftovers

    def touch(self, entry: Entry) -> None:
        """Record use, for `cache gc --older-than` (best effort: a read-only cache still builds).
        Never through a symlink: a planted `.last_used` link is replaced, its target left alone."""
        marker = entry.path / LAST_USED
        with contextlib.suppress(OSError):
            if marker.is_symlink():
                marker.unlink()
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as handle:
                handle.write(str(time.time()))

    def last_used(self, entry: Entry) -> float:
        """When the entry was last used; never later than now (a clock set back must not make an
        entry look younger than it is to gc, nor an age negative)."""
        marker = entry.path / LAST_USED
        try:
            fd = os.open(marker, os.O_RDONLY | _NOFOLLOW)
            with os.fdopen(fd) as handle:
                used = float(handle.read(64))
        except (OSError, ValueError):
            try:
                used = (entry.path / MANIFEST).stat().st_mtime
            except OSError:
                used = entry.path.stat().st_mtime
        return min(used, time.time()) if used == used else 0.0  # NaN counts as never used

    # -- resume dirs of interrupted draft trainings --------------------------------------------
    def resume_dirs(self) -> list[Path]:
        base = self.root / RESUME
        return sorted(p for p in base.iterdir() if _is_real_dir(p)) if _is_real_dir(base) else []

    def resume_last_used(self, path: Path) -> float:
        times = [p.stat().st_mtime for p in (path, *path.iterdir()) if not p.is_symlink()]
        return min(max(times), time.time())

    def resume_busy(self, path: Path) -> bool:
        """True while a build trains into `path` (it holds resume_in_use's lock)."""
        lock = path / _IN_USE
        if not lock.exists() and not lock.is_symlink():
            return False
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_APPEND | _NOFOLLOW)
        except OSError:  # a symlink planted as the lock: not ours to judge, leave the dir alone
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def remove_resume(self, path: Path) -> None:
        if path.parent != self.root / RESUME or path.is_symlink():
            raise ValueError(f"{path} is not a resume dir of {self.root}")
        trash = path.with_name(f"{_TMP_PREFIX}gc-{path.name}-{secrets.token_hex(4)}")
        os.rename(path, trash)  # raises OSError when it cannot be removed; nothing is then
        shutil.rmtree(trash, ignore_errors=True)

    # -- leases: a running server's entries -------------------------------------------------
    def lease(self, path: Path) -> int | None:
        """A shared lock on the entry at `path` (a file descriptor, held until closed or the process
        ends) so `cache gc` and `clean --cache` leave it alone; None when `path` is no entry of this
        cache (a build output elsewhere) or the lock file cannot be made (a read-only cache)."""
        path = Path(path)
        if path.parent.parent != self.root or not _is_real_dir(path) or not _is_plain_file(path / MANIFEST):
            return None
        try:
            fd = os.open(path / _IN_USE, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not _is_plain_file(path / MANIFEST):  # removed while we waited for the lock
            os.close(fd)
            return None
        return fd

    def in_use(self, entry: Entry) -> bool:
        """True while a server holds a lease on the entry."""
        with self._exclusive(entry) as free:
            return not free

    @contextlib.contextmanager
    def _exclusive(self, entry: Entry) -> Iterator[bool]:
        """Holds the entry's lease lock exclusively (yields True), or yields False when a lease is held.
        In a read-only cache no server could have made the lock file (`lease` makes it), so a missing
        one means free, and an existing one is locked through a read-only descriptor."""
        lock = entry.path / _IN_USE
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM) or lock.is_symlink():
                yield False  # a planted symlink (ELOOP): not ours to judge, treat as held
                return
            try:
                fd = os.open(lock, os.O_RDONLY | _NOFOLLOW)
            except FileNotFoundError:
                yield True  # nobody could have leased it; removing will fail on its own terms
                return
            except OSError:
                yield False
                return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def remove(self, entry: Entry) -> bool:
        """Removes the entry unless a server leases it (returns False then). The rename happens under
        the exclusive lease lock, so a server never leases an entry that is about to vanish. Raises
        OSError when the entry cannot be removed (a read-only cache): nothing is removed then."""
        if entry.path.parent.parent != self.root or not _is_real_dir(entry.path):
            raise ValueError(f"{entry.path} is not an entry of {self.root}")
        with self._exclusive(entry) as free:
            if not free:
                return False
            trash = entry.path.with_name(f"{_TMP_PREFIX}gc-{entry.key}-{secrets.token_hex(4)}")
            os.rename(entry.path, trash)  # vanish atomically first, then delete at leisure
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def remove_incomplete(self, path: Path) -> None:
        if path.parent.parent != self.root or not path.name.startswith(_TMP_PREFIX) or not _is_real_dir(path):
            raise ValueError(f"{path} is not a leftover of {self.root}")
        trash = path.with_name(f"{_TMP_PREFIX}gc-{secrets.token_hex(4)}")
        os.rename(path, trash)  # raises OSError when it cannot be removed (a read-only cache)
        shutil.rmtree(trash, ignore_errors=True)  # rmtree never follows the symlinks inside


def _is_real_dir(path: Path) -> bool:
    """A directory, not a symlink to one (lstat)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_plain_file(path: Path) -> bool:
    """A regular file, not a symlink to one (lstat)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _stamps(directory: Path, files: dict[str, dict[str, Any]]) -> dict[str, list[int]]:
    stamps = {}
    for rel, info in files.items():
        if "sha256" in info:
            stamps[rel] = _stamp((directory / rel).lstat())
    return stamps


def _stamp(st: os.stat_result) -> list[int]:
    """What must be unchanged for a file not to be hashed again: the ctime is set by the kernel on
    every write, chmod, link and utime, and no caller can set it back."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


@contextlib.contextmanager
def resume_in_use(path: Path) -> Iterator[None]:
    """Held while a draft training reads and writes its resume dir, so `cache gc` leaves it alone."""
    path.mkdir(parents=True, exist_ok=True)
    with open(path / _IN_USE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
            files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return files


def dir_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


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
