"""Issue 24 finding 10: `cache gc` and `clean --cache` act only in a trtbuild cache, never follow a
symlink, never remove what a running server leases, and `clean --cache` removes only the entries of
the recipe named (its file, not just its name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtbuild.cli import common as cli
from trtbuild.cli import main
from trtbuild.core.cache import LAST_USED, MARKER, ArtifactCache


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every path under root with its content (files) or link target (symlinks)."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else (path.read_bytes() if path.is_file() else "d")
    return found


def _model_dir(root: Path, vocab: int = 8) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1,
                                                  "hidden_size": 4, "vocab_size": vocab}))
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(root / "model.safetensors"))
    return root


def _recipe(where: Path, model: Path, name: str = "r") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    recipe = where / "r.yaml"
    recipe.write_text(f"name: {name}\noutput_dir: out\nmodel:\n  source: path\n  path: {model}\n")
    return recipe


def _home_like(root: Path) -> None:
    """What the finding's gc removed: public/, notes/2024/ and a .tmp-* folder of a user's tree."""
    for rel, text in {"public/index.html": "<p>mine</p>", "notes/2024/manifest.json": "{broken",
                      "notes/2024/todo.txt": "keep", ".tmp-x-1-abcd/draft.txt": "wip",
                      "model/k1/manifest.json": "{not a cache entry", "model/k1/weights.bin": "w",
                      "model/.tmp-k-999999-beef/x": "x"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.mark.parametrize("command", [["cache", "gc", "--older-than", "0"], ["cache", "gc"]])
def test_gc_in_a_directory_that_is_not_a_cache_removes_nothing_and_says_why(tmp_path, monkeypatch, capsys, command):
    home = tmp_path / "home"
    _home_like(home)
    monkeypatch.setenv("TRTBUILD_CACHE", str(home))
    before = _tree(home)
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{home} is not a trtbuild cache" in err and "nothing was removed" in err, err
    assert _tree(home) == before  # not one file removed, and no marker written


def test_clean_cache_in_a_directory_that_is_not_a_cache_removes_nothing(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    _home_like(home)
    (home / "model" / "k1" / "manifest.json").write_text(json.dumps({"recipe": {"name": "r"}}))
    monkeypatch.setenv("TRTBUILD_CACHE", str(home))
    recipe = _recipe(tmp_path / "proj", tmp_path / "m")
    before = _tree(home)
    with pytest.raises(SystemExit) as exit_info:
        main(["clean", str(recipe), "--cache"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "is not a trtbuild cache" in err and len(err.splitlines()) == 1, err
    assert _tree(home) == before


def test_a_new_cache_is_marked_and_an_older_unmarked_one_is_recognised(tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE", str(root))
    recipe = _recipe(tmp_path / "proj", _model_dir(tmp_path / "m"))
    main(["build", str(recipe), "--json"])
    capsys.readouterr()
    assert (root / MARKER).is_file()
    (root / MARKER).unlink()  # a cache made before the marker existed: only trtbuild's layout in it
    main(["cache", "gc", "--older-than", "0"])
    assert "1 entries" in capsys.readouterr().out and ArtifactCache(root).entries() == []
    assert (root / MARKER).is_file()


def test_gc_never_follows_symlinks(tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE", str(root))
    store = ArtifactCache(root)
    work = store.new_workdir("model", "k1")
    (work / "f").write_text("1")
    store.commit(work, "model", "k1", {"recipe": {"name": "r"}})
    user = tmp_path / "user"
    _home_like(user)
    (root / "quantize").symlink_to(user / "model")  # a stage dir that is a link into user data
    (root / "draft").mkdir()
    (root / "draft" / "k2").symlink_to(user / "notes")  # an entry that is a link
    (root / "engine").mkdir()
    (root / "engine" / ".tmp-x-1-dead").symlink_to(user / "public")  # a "leftover" that is a link
    before = _tree(user)
    main(["cache", "gc", "--older-than", "0"])
    out = capsys.readouterr().out
    assert "removed model/k1" in out and "0 broken" in out and "0 incomplete" in out, out
    assert _tree(user) == before


def test_a_last_used_symlink_is_replaced_not_written_through(tmp_path, monkeypatch):
    store = ArtifactCache(tmp_path / "cache")
    work = store.new_workdir("model", "k1")
    (work / "f").write_text("1")
    entry = store.commit(work, "model", "k1", {"recipe": {"name": "r"}})
    victim = tmp_path / "precious.txt"
    victim.write_text("do not overwrite")
    (entry.path / LAST_USED).symlink_to(victim)
    assert store.last_used(entry) < time.time() + 1  # read without following: the manifest's time
    store.touch(entry)
    assert victim.read_text() == "do not overwrite"
    assert not (entry.path / LAST_USED).is_symlink() and float((entry.path / LAST_USED).read_text()) > 0


_HOLD = """
import sys, time
from pathlib import Path
from trtbuild.core.cache import ArtifactCache
fd = ArtifactCache(Path(sys.argv[1])).lease(Path(sys.argv[2]))
print("leased" if fd is not None else "no lease", flush=True)
time.sleep(60)
"""


def test_gc_and_clean_keep_an_entry_a_server_leases(tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE", str(root))
    recipe = _recipe(tmp_path / "proj", _model_dir(tmp_path / "m"))
    main(["build", str(recipe), "--json"])
    capsys.readouterr()
    (entry,) = ArtifactCache(root).entries()
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[2])}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(root), str(entry.path)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "leased"
        main(["cache", "gc", "--older-than", "0"])
        out = capsys.readouterr().out
        assert f"kept model/{entry.key}: a running server uses it" in out and "0 entries" in out, out
        main(["clean", str(recipe), "--cache"])
        assert "0 cache entries (kept 1 a running server uses" in capsys.readouterr().out
        assert entry.path.is_dir()
    finally:
        holder.kill()
        holder.wait()
    main(["cache", "gc", "--older-than", "0"])  # the server is gone: its lease with it
    assert f"removed model/{entry.key}" in capsys.readouterr().out and not entry.path.exists()


def test_what_serve_builds_is_leased_for_the_process_lifetime(tmp_path, monkeypatch, capsys):
    """`serve`, `demo` and `bench` get their artifacts from cli.built, which leases them."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE", str(root))
    recipe = _recipe(tmp_path / "proj", _model_dir(tmp_path / "m"))
    before = len(cli.LEASES)
    _, artifacts = cli.built(str(recipe), (), "model", False)
    capsys.readouterr()
    try:
        assert len(cli.LEASES) == before + 1
        env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[2])}
        gc = subprocess.run([sys.executable, "-m", "trtbuild.cli", "cache", "gc", "--older-than", "0"], env=env,
                            capture_output=True, text=True, check=True)
        assert "a running server uses it" in gc.stdout and artifacts["model"].is_dir(), gc.stdout
    finally:
        for fd in cli.LEASES[before:]:
            os.close(fd)
        del cli.LEASES[before:]


def test_clean_cache_removes_only_the_named_recipes_entries(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "cache"))
    mine = _recipe(tmp_path / "a", _model_dir(tmp_path / "m1"))
    theirs = _recipe(tmp_path / "b", _model_dir(tmp_path / "m2", vocab=16))  # same name "r", another file
    for recipe in (mine, theirs):
        main(["build", str(recipe), "--json"])
    capsys.readouterr()
    store = ArtifactCache(tmp_path / "cache")
    by_file = {e.manifest()["recipe"]["file"]: e for e in store.entries()}
    assert set(by_file) == {str(mine.resolve()), str(theirs.resolve())}
    main(["clean", str(mine), "--cache"])
    assert "1 cache entries" in capsys.readouterr().out
    assert store.entries() == [by_file[str(theirs.resolve())]]
