"""Issue 13: a full disk during a stage is one line naming the path and the free space, exit 2, and
leaves nothing half-written in the cache or the output dir. The cache is a real 512 KB tmpfs that the
engine stage (which copies the target's files across filesystems) fills."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from draft_fixtures import write_target

from trtbuild.cli import main


@pytest.fixture()
def small_disk(tmp_path: Path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_is_one_line_and_leaves_nothing(tmp_path, small_disk, monkeypatch, capsys):
    model = write_target(tmp_path / "model" / "hf")
    size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert size > 512 * 1024, "the target must not fit the small disk"
    cache = small_disk / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE", str(cache))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: full\noutput_dir: out\nmodel:\n  source: path\n  path: {model}\nengine: {{}}\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["build", str(recipe), "--json"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "No space left on device" in err and "free on that filesystem" in err and str(cache) in err, err
    assert "nothing half-written was kept" in err
    leftovers = [p for p in (cache / "engine").iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []
    assert [p.name for p in (cache / "engine").iterdir() if not p.name.startswith(".")] == []
    assert not (tmp_path / "out" / "engine").exists()
