"""Sharded, resumable, content-addressed tensor sets in the cache: the draft's data and hidden states.

A set is made of shards `shard-NNNNN.safetensors`, shard i holding rows [i*S, (i+1)*S) of the whole;
shards are independent of each other (any process may make any index). While a set is being made
its shards live in `<cache>/resume/<kind>-<key>/`; each is written to a temporary name and renamed,
so a shard file that exists is complete and a kill -9 at any point loses at most the shard in
flight. When every shard is there they are renamed (same inode, same mtime) into a new cache entry
`<cache>/<kind>/<key>/` with `set.json` (what the set is) and a manifest of every file's sha256,
committed the way stage artifacts are (trtbuild/core/cache.py). The key hashes what shapes the content,
never a training setting, so a training with another lr or step count finds the set again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtbuild.core.cache import RESUME, ArtifactCache, default_root, resume_in_use

SET_META = "set.json"
_PATTERN = "shard-{:05d}.safetensors"


@dataclass(frozen=True)
class ShardSet:
    path: Path  # the cache entry
    key: str
    reused: bool  # found in the cache: nothing was computed
    computed: int  # shards made by this run
    kept: int  # shards a killed run had finished, kept
    seconds: float


def make_set(kind: str, key: str, count: int, what: str, progress: Any,
             write: Callable[[Path, list[int]], dict[str, Any]]) -> ShardSet:
    """The set `kind`/`key` of `count` shards: from the cache, or made now. `write(work, todo)` writes
    the shards `todo` (those a killed run finished are kept) into `work` and returns the set's meta."""
    found = reuse(kind, key)
    if found is not None:
        return ShardSet(found, key, reused=True, computed=0, kept=0, seconds=0.0)
    started = time.perf_counter()
    with resumable(kind, key) as work:
        found = entry_dir(kind, key)
        if found is not None:  # a concurrent build made it while this one waited for the lock
            return ShardSet(found, key, reused=True, computed=0, kept=0, seconds=0.0)
        done = finished(work, count)
        if done:
            progress.log(f"{what}: {len(done)}/{count} shards kept from an interrupted run ({work})")
        todo = [i for i in range(count) if i not in done]
        path = publish(work, kind, key, count, write(work, todo))
    shutil.rmtree(resume_dir(kind, key), ignore_errors=True)
    return ShardSet(path, key, reused=False, computed=len(todo), kept=len(done),
                    seconds=time.perf_counter() - started)


def shard_name(index: int) -> str:
    return _PATTERN.format(index)


def shard_count(rows: int, shard_rows: int) -> int:
    return max(1, -(-rows // shard_rows))


def entry_dir(kind: str, key: str) -> Path | None:
    """The finished set (a cache entry with a readable manifest), or None."""
    entry = ArtifactCache(default_root()).lookup(kind, key)
    return entry.path if entry is not None else None


def reuse(kind: str, key: str) -> Path | None:
    """The finished set for a build: checked against its manifest (a damaged one is removed and made
    again) and marked used for `cache gc --older-than`. `entry_dir` is the look that touches nothing."""
    cache = ArtifactCache(default_root())
    entry = cache.lookup(kind, key)
    if entry is None:
        return None
    if cache.damage(entry, record=True) is not None:
        cache.remove(entry)
        return None
    cache.touch(entry)
    return entry.path


def resume_dir(kind: str, key: str) -> Path:
    return default_root() / RESUME / f"{kind}-{key}"


def finished(directory: Path, count: int) -> set[int]:
    """Indices whose shard file is complete (present under its final name)."""
    return {i for i in range(count) if (directory / shard_name(i)).is_file()}


def write_shard(directory: Path, index: int, tensors: dict[str, Any]) -> Path:
    """Write shard `index` under a temporary name, fsync, then rename: present means complete."""
    from safetensors.torch import save_file

    final = directory / shard_name(index)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def _drop_partials(directory: Path) -> None:
    """Temporary shards of killed runs (never complete, never read)."""
    for leftover in directory.glob(".shard-*.tmp"):
        with contextlib.suppress(OSError):
            leftover.unlink()


@contextlib.contextmanager
def resumable(kind: str, key: str) -> Iterator[Path]:
    """The set's resume dir, held against `cache gc`, with the partial shards of killed runs removed."""
    directory = resume_dir(kind, key)
    with resume_in_use(directory):
        directory.mkdir(parents=True, exist_ok=True)  # removed by a build that finished while we waited
        _drop_partials(directory)
        yield directory


def publish(directory: Path, kind: str, key: str, count: int, meta: dict[str, Any]) -> Path:
    """Move the complete shards of `directory` into the cache entry `<kind>/<key>` and commit it."""
    cache = ArtifactCache(default_root())
    with cache.lock(kind, key):
        existing = cache.lookup(kind, key)
        if existing is not None:  # another build published it meanwhile
            return existing.path
        workdir = cache.new_workdir(kind, key)
        try:
            for index in range(count):
                os.rename(directory / shard_name(index), workdir / shard_name(index))
            (workdir / SET_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            entry = cache.commit(workdir, kind, key, {"stage": kind, "key": key, "created":
                                                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                      "set": meta})
        except BaseException:
            # put finished shards back, so the next run resumes instead of starting over
            for index in range(count):
                with contextlib.suppress(OSError):
                    os.rename(workdir / shard_name(index), directory / shard_name(index))
            cache.discard(workdir)
            raise
    return entry.path


def read_meta(entry: Path) -> dict[str, Any]:
    return json.loads((entry / SET_META).read_text())


def shard_bytes(entry: Path) -> int:
    return sum(p.stat().st_size for p in entry.glob("shard-*.safetensors"))
