"""Issue 38 finding 2: content corrupted in place with its size and mtime kept (a hidden-state shard,
a weight file, a deploy config) is caught at its next use, and `trtbuild cache verify` re-hashes an
entry or the whole cache whatever the files' stamps say (bit rot changes none of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtbuild.core.cache import VERIFIED, ArtifactCache
from trtbuild.core.layout import DRAFT_HIDDEN
from trtbuild.draft import shards


def _corrupt_in_place(path: Path) -> None:
    """Random bytes over the middle of the file; size, atime and mtime as they were."""
    st = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(st.st_size // 2)
        old = handle.read(16)
        new = os.urandom(len(old))
        while new == old:
            new = os.urandom(len(old))
        handle.seek(st.st_size // 2)
        handle.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def _entry(store: ArtifactCache, stage: str, key: str, files: dict[str, bytes]):
    work = store.new_workdir(stage, key)
    for name, data in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
    return store.commit(work, stage, key, {"recipe": {"name": "r", "file": ""}, "created": "now"})


def _weights() -> bytes:
    from safetensors.torch import save

    return save({"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(0))})


@pytest.mark.parametrize(("stage", "rel", "data"), [
    ("quantize", "hf/model.safetensors", None),
    ("deploy", "repo/tiny/config.pbtxt", b'name: "tiny"\nbackend: "python"\nmax_batch_size: 8\n' * 4),
])
def test_weights_and_configs_corrupted_in_place_are_caught_at_next_use(isolated_cache, stage, rel, data):
    store = ArtifactCache(isolated_cache)
    entry = _entry(store, stage, "k1", {rel: data if data is not None else _weights()})
    assert store.damage(entry, record=True) is None  # a use: its check is recorded
    _corrupt_in_place(entry.path / rel)
    problem = store.damage(entry, record=True)
    assert problem is not None and rel in problem and "sha256" in problem, problem


def test_a_shard_corrupted_in_place_is_made_again_not_trained_on(isolated_cache):
    directory = isolated_cache / "work"
    directory.mkdir(parents=True)
    shards.write_shard(directory, 0, {"hidden": torch.randn(8, 16, generator=torch.Generator().manual_seed(1))})
    path = shards.publish(directory, DRAFT_HIDDEN, "k1", 1, {"rows": 8})
    assert shards.reuse(DRAFT_HIDDEN, "k1") == path  # intact: reused, and its check recorded
    _corrupt_in_place(path / shards.shard_name(0))
    assert shards.reuse(DRAFT_HIDDEN, "k1") is None  # damaged: dropped, so the set is made again
    assert not path.exists()


def _verify(root: Path, *names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", f"from trtbuild.cli import main; main(['cache', 'verify', "
                           f"*{list(names)!r}])"], capture_output=True, text=True,
                          env={**os.environ, "TRTBUILD_CACHE": str(root)})


def test_cache_verify_rehashes_what_the_stamps_would_skip(isolated_cache):
    store = ArtifactCache(isolated_cache)
    good = _entry(store, "quantize", "good", {"hf/model.safetensors": _weights()})
    rotten = _entry(store, "deploy", "rotten", {"config.pbtxt": b'name: "tiny"\n' * 8})
    for entry in (good, rotten):
        assert store.damage(entry, record=True) is None
    _corrupt_in_place(rotten.path / "config.pbtxt")
    # Bit rot: the content changed under the file system, so every stamp still matches its record.
    stamps = json.loads((rotten.path / VERIFIED).read_text())
    st = (rotten.path / "config.pbtxt").lstat()
    stamps["config.pbtxt"] = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
    (rotten.path / VERIFIED).write_text(json.dumps(stamps))
    assert store.damage(rotten) is None  # the cheap check at use cannot see it ...

    result = _verify(isolated_cache)  # ... cache verify does
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ok quantize/good" in result.stdout and "damaged deploy/rotten: config.pbtxt" in result.stdout
    assert "1 intact, 1 damaged" in result.stdout, result.stdout
    assert store.damage(rotten) is not None  # and the next use sees it too: that build rebuilds it

    result = _verify(isolated_cache, "quantize/good")
    assert result.returncode == 0 and "1 intact, 0 damaged" in result.stdout, result.stdout + result.stderr
    result = _verify(isolated_cache, "quantize/nope")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "quantize/nope" in result.stderr
