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


def test_disk_full_during_the_hidden_state_dump_is_one_line(tmp_path, small_disk, monkeypatch, capsys):
    """Issue 38 finding 6: safetensors reports a full disk as its own SafetensorError, which was a
    53-line traceback and exit 1. The data shards (token ids) fit the 512 KB disk; the hidden states
    (64 x 32 tokens x 4 layers x 64 floats: 2 MB) do not."""
    model = write_target(tmp_path / "model" / "hf")
    cache = small_disk / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE", str(cache))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: full\noutput_dir: out\nmodel:\n  source: path\n  path: {model}\n"
                      "draft:\n  hidden_states: offline\n  samples: 64\n  seq_len: 32\n  prompt_len: 4\n"
                      "  shard_samples: 64\n  steps: 1\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["build", str(recipe), "--json"])
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and exit_info.value.code == 2, err
    said = [s for s in err.splitlines() if s.strip() and not s.startswith("Loading weights")]  # transformers
    assert len(said) == 1 and said[0].startswith("error: "), err
    assert "No space left on device" in err and "free on that filesystem" in err and str(cache) in err, err
    assert not list(cache.glob("draft-hidden/*/*.safetensors"))  # no set was published
    assert not list(cache.glob("resume/**/*.tmp")), list(cache.rglob("*"))  # nor a half-written shard kept
