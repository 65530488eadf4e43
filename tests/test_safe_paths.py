"""Finding 1 of issue 13: `clean` and builds never write or delete outside the output dir and the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtbuild.app.pipeline import _link_output
from trtbuild.cli import main
from trtbuild.core.errors import UserError
from trtbuild.core.safepaths import OUTPUT_MARKER, clean_output_dir, ensure_inside


def _validate(recipe: Path, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(recipe)])
    return exit_info.value.code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("name", ["../victim", '""', "../../../etc", "a/b", "..", "."])
def test_escaping_names_are_refused_at_validate(tmp_path, capsys, name):
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.parent.mkdir()
    recipe.write_text(f"name: {name}\nmodel: {{source: tiny}}\n")
    code, err = _validate(recipe, capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{recipe}:1: name:" in err and "not a usable name" in err


@pytest.mark.parametrize("output_dir", ["..", ".", "/", "../.."])
def test_output_dirs_holding_the_recipe_are_refused(tmp_path, capsys, output_dir):
    recipe = tmp_path / "a" / "b" / "r.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(f"name: ok\noutput_dir: {output_dir}\nmodel: {{source: tiny}}\n")
    code, err = _validate(recipe, capsys)
    assert code == 2 and f"{recipe}:2: output_dir:" in err


def test_output_dir_inside_the_cache_is_refused(tmp_path, capsys, monkeypatch):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: ok\noutput_dir: {tmp_path / 'cache' / 'x'}\nmodel: {{source: tiny}}\n")
    code, err = _validate(recipe, capsys)
    assert code == 2 and "overlaps the artifact cache" in err


def test_clean_refuses_a_directory_trtbuild_did_not_make(tmp_path, capsys, monkeypatch):
    """The attack of the finding: a recipe whose output dir is someone else's directory."""
    victim = tmp_path / "victim"
    (victim / "model").mkdir(parents=True)
    (victim / "model" / "precious.txt").write_text("keep me")
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.parent.mkdir()
    recipe.write_text(f"name: ok\noutput_dir: {victim}\nmodel: {{source: tiny}}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["clean", str(recipe)])
    assert exit_info.value.code == 2
    assert "no .trtbuild-output marker" in capsys.readouterr().err
    assert (victim / "model" / "precious.txt").read_text() == "keep me"


def test_clean_removes_only_what_a_build_wrote(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    entry = cache / "model" / "k1"
    entry.mkdir(parents=True)
    (entry / "weights").write_text("w")
    out = tmp_path / "build" / "ok"
    _link_output(out, "model", entry, cache)
    assert (out / OUTPUT_MARKER).is_file() and (out / "model").is_symlink()
    (out / "build.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.parent.mkdir()
    recipe.write_text(f"name: ok\noutput_dir: {out}\nmodel: {{source: tiny}}\n")
    main(["clean", str(recipe)])
    assert "removed model, build.json" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (entry / "weights").read_text() == "w"  # the link went, the cache entry it pointed at stays
    (out / "notes.txt").unlink()
    _link_output(out, "model", entry, cache)
    main(["clean", str(recipe)])
    assert not out.exists()


def test_links_only_point_into_the_cache(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sneaky = tmp_path / "cache" / "model" / "k"
    sneaky.parent.mkdir(parents=True)
    sneaky.symlink_to(elsewhere)  # a planted symlink inside the cache
    with pytest.raises(UserError, match="outside"):
        _link_output(tmp_path / "out", "model", sneaky, tmp_path / "cache")


def test_clean_does_not_follow_a_planted_symlink(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / OUTPUT_MARKER).write_text("")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file").write_text("x")
    (out / "bench").symlink_to(victim)  # unlinked, never recursed into
    clean_output_dir(out)
    assert (victim / "file").read_text() == "x" and not out.exists()


def test_ensure_inside_resolves_dotdot(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    assert ensure_inside(root / "a", [root], "write") == root / "a"
    with pytest.raises(UserError):
        ensure_inside(root / ".." / "b", [root], "write")


def test_bench_output_cannot_be_redirected_by_a_symlink(tmp_path):
    from types import SimpleNamespace

    from trtbuild.cli.common import bench_dir as _bench_dir

    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "bench").symlink_to(elsewhere)
    with pytest.raises(UserError, match="outside"):
        _bench_dir(SimpleNamespace(output_path=out))
    (out / "bench").unlink()
    assert _bench_dir(SimpleNamespace(output_path=out)) == out / "bench"
