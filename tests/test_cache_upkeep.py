"""Finding 7 of issue 13: cache entries are touched on use, hash-checked before reuse, gc takes no
negative ages, a broken manifest is reported and skipped, and draft resume dirs are listed and collected."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from trtbuild.cli import main
from trtbuild.core.cache import LAST_USED, ArtifactCache, resume_in_use


@pytest.fixture()
def store(isolated_cache) -> ArtifactCache:
    return ArtifactCache(isolated_cache)


def _entry(store: ArtifactCache, stage: str, key: str, files: dict[str, bytes], recipe: str = "r",
           recipe_file: str = ""):
    work = store.new_workdir(stage, key)
    for name, data in files.items():
        (work / name).write_bytes(data)
    return store.commit(work, stage, key, {"recipe": {"name": recipe, "file": recipe_file}, "created": "now"})


def _model_dir(root: Path) -> Path:
    """A Hugging Face directory the model stage accepts (config.json + safetensors weights)."""
    import numpy as np
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1,
                                                  "hidden_size": 4, "vocab_size": 8}))
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(root / "model.safetensors"))
    return root


def _recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\noutput_dir: out\nmodel:\n  source: path\n  path: {_model_dir(tmp_path / 'm')}\n")
    return recipe


def _build(capsys, recipe: Path) -> dict:
    main(["build", str(recipe), "--json"])
    return json.loads(capsys.readouterr().out)


def test_use_touches_the_entry_so_gc_keeps_it(tmp_path, store, capsys):
    recipe = _recipe(tmp_path)
    _build(capsys, recipe)
    (entry,) = store.entries()
    old = time.time() - 10 * 86400
    (entry.path / LAST_USED).write_text(str(old))
    os.utime(entry.path / "manifest.json", (old, old))
    assert _build(capsys, recipe)["stages"][0]["status"] == "cached"
    assert store.last_used(entry) > time.time() - 60  # the cached build counted as use
    main(["cache", "gc", "--older-than", "1"])
    assert "0 entries" in capsys.readouterr().out and store.entries() == [entry]


def test_a_damaged_entry_is_rebuilt(tmp_path, store, capsys):
    recipe = _recipe(tmp_path)
    _build(capsys, recipe)
    (entry,) = store.entries()
    link = entry.path / "hf"
    link.unlink()
    link.symlink_to(tmp_path)  # points elsewhere now
    main(["plan", str(recipe), "--json"])
    planned = json.loads(capsys.readouterr().out)["stages"][0]
    assert planned["status"] == "will-run" and "damaged" in planned["reason"] and "hf" in planned["reason"]
    assert _build(capsys, recipe)["stages"][0]["status"] == "ran"
    assert os.readlink(entry.path / "hf") == str((tmp_path / "m").resolve())
    assert store.damage(store.entries()[0]) is None


def test_truncation_and_hard_links_are_caught(store):
    upstream = _entry(store, "quantize", "k1", {"w.safetensors": b"x" * 1000})
    work = store.new_workdir("engine", "k2")
    os.link(upstream.path / "w.safetensors", work / "w.safetensors")  # what the engine bundle does
    downstream = store.commit(work, "engine", "k2", {})
    assert store.damage(upstream, record=True) is None and store.damage(downstream, record=True) is None
    with open(upstream.path / "w.safetensors", "r+b") as f:
        f.truncate(10)
    assert "10 bytes" in store.damage(upstream)
    assert "10 bytes" in store.damage(downstream)  # the hard link carried the damage: caught there too


def test_same_size_corruption_is_caught_by_the_hash(store):
    entry = _entry(store, "quantize", "k1", {"w": b"a" * 100})
    assert store.damage(entry, record=True) is None
    with open(entry.path / "w", "r+b") as f:
        f.write(b"b")
    assert "sha256" in store.damage(entry)


def test_unchanged_files_are_not_hashed_again(store, monkeypatch):
    from trtbuild.core import cache as cache_module

    entry = _entry(store, "quantize", "k1", {"w": b"a" * 100})
    store.damage(entry, record=True)
    calls = []
    monkeypatch.setattr(cache_module, "sha256_file", lambda path: calls.append(path) or "")
    assert store.damage(entry) is None and calls == []


@pytest.mark.parametrize("days", ["-1", "nan", "inf", "-0.5"])
def test_gc_refuses_negative_ages(store, capsys, days):
    _entry(store, "model", "k", {"f": b"1"})
    with pytest.raises(SystemExit) as exit_info:
        main(["cache", "gc", "--older-than", days])
    assert exit_info.value.code == 2 and "days >= 0" in capsys.readouterr().err
    assert len(store.entries()) == 1


def test_an_entry_used_in_the_future_is_not_younger_than_now(store):
    entry = _entry(store, "model", "k", {"f": b"1"})
    (entry.path / LAST_USED).write_text(str(time.time() + 1e9))
    assert store.last_used(entry) <= time.time()


def test_a_broken_manifest_is_reported_and_skipped(tmp_path, store, capsys):
    good = _entry(store, "model", "k1", {"f": b"1"}, recipe="r", recipe_file=str(tmp_path / "rr.yaml"))
    bad = _entry(store, "model", "k2", {"f": b"1"}, recipe="r")
    (bad.path / "manifest.json").write_text('{"recipe": {"na')  # truncated
    also_bad = _entry(store, "model", "k3", {"f": b"1"}, recipe="r")
    (also_bad.path / "manifest.json").write_text("[1, 2]")  # JSON, not an object
    assert store.lookup("model", "k2") is None  # never reused: rebuilt on the next build
    main(["cache", "ls", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in listed["entries"]] == ["k1"]
    assert sorted(listed["broken"]) == sorted([str(bad.path), str(also_bad.path)])
    main(["cache", "ls"])
    assert "broken manifest" in capsys.readouterr().out
    recipe = tmp_path / "rr.yaml"
    recipe.write_text("name: r\noutput_dir: out\nmodel: {source: tiny}\n")
    main(["clean", str(recipe), "--cache"])
    assert "1 cache entries" in capsys.readouterr().out and not good.path.exists()
    main(["cache", "gc"])
    assert "2 broken" in capsys.readouterr().out and store.entries() == []


def test_resume_dirs_are_listed_and_collected(store, capsys):
    stale = store.root / "resume" / "draft-old"
    stale.mkdir(parents=True)
    (stale / "state.safetensors").write_bytes(b"x" * 10)
    old = time.time() - 40 * 86400
    for path in (stale / "state.safetensors", stale):
        os.utime(path, (old, old))
    busy = store.root / "resume" / "draft-busy"
    main(["cache", "ls", "--json"])
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert [(r["stage"], r["key"], r["bytes"]) for r in rows] == [("resume", "draft-old", 10)]
    with resume_in_use(busy):
        os.utime(busy, (old, old))
        os.utime(busy / ".in-use", (old, old))
        main(["cache", "gc"])
        out = capsys.readouterr().out
    assert "removed resume/draft-old" in out and "1 resume dirs" in out
    assert not stale.exists() and busy.exists()  # the one a build trains into stays
    with open(busy / ".in-use", "a") as handle:  # the lock is free again
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_fresh_entry_is_not_hashed_again_on_first_use(store, monkeypatch):
    from trtbuild.core import cache as cache_module

    entry = _entry(store, "quantize", "k1", {"w": b"a" * 100})  # commit hashed it already
    calls = []
    monkeypatch.setattr(cache_module, "sha256_file", lambda path: calls.append(path) or "")
    assert store.damage(entry) is None and calls == []
