"""The pipeline's promises: cache hits, targeted rebuilds, atomic entries, output links."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from quantize_fixtures import make_model_dir

from trtbuild.cli import main
from trtbuild.core.cache import ArtifactCache

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("small"), train_steps=20) / "hf"


@pytest.fixture()
def cache_dir(isolated_cache) -> Path:
    return isolated_cache


def _recipe(tmp_path: Path, model_dir: Path, extra: str = "") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"name: pipe\noutput_dir: out\nmodel:\n  source: path\n  path: {model_dir}\n{extra}")
    return path


QUANTIZE = """quantize:
  kv_cache: none
  calibration: {num_samples: 8, seq_len: 32, batch_size: 4}
  gate: {max_perplexity_ratio: 1.5, eval_samples: 4, seq_len: 32}
"""


def _build(capsys, *args: str) -> dict:
    main(["build", *args, "--json"])
    return json.loads(capsys.readouterr().out)


def _status(report: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in report["stages"]}


def test_second_build_is_cached_and_links_outputs(tmp_path, cache_dir, small_model, capsys):
    recipe = _recipe(tmp_path, small_model)
    first = _build(capsys, str(recipe))
    assert _status(first) == {"model": "ran", "quantize": "skipped", "draft": "skipped",
                              "engine": "skipped", "deploy": "skipped"}
    second = _build(capsys, str(recipe))
    assert _status(second)["model"] == "cached"
    assert second["stages"][0]["key"] == first["stages"][0]["key"]
    link = tmp_path / "out" / "model"
    assert link.is_symlink() and link.resolve() == Path(first["stages"][0]["artifact"]).resolve()
    manifest = json.loads((link / "manifest.json").read_text())
    assert manifest["key"] == first["stages"][0]["key"]
    assert manifest["key_components"]["libraries"]["torch"]
    assert manifest["files"]["hf"]["symlink"] == str(small_model.resolve())
    assert json.loads((tmp_path / "out" / "build.json").read_text())["stages"][0]["status"] == "cached"


def test_plan_touches_nothing(tmp_path, cache_dir, small_model, capsys):
    recipe = _recipe(tmp_path, small_model)
    main(["plan", str(recipe), "--json"])
    planned = json.loads(capsys.readouterr().out)
    assert _status(planned)["model"] == "will-run"
    assert not cache_dir.exists() and not (tmp_path / "out").exists()


def test_changing_one_field_reruns_that_stage_and_later_ones_only(tmp_path, cache_dir, small_model, capsys):
    recipe = _recipe(tmp_path, small_model, QUANTIZE)
    first = _build(capsys, str(recipe))
    assert _status(first)["quantize"] == "ran"
    assert first["stages"][1]["metrics"]["perplexity_ratio"] > 0
    main(["plan", str(recipe), "--set", "quantize.calibration.num_samples=12", "--json"])
    why = {s["name"]: s["reason"] for s in json.loads(capsys.readouterr().out)["stages"]}
    assert why["quantize"] == "changed: config.calibration.num_samples 8 -> 12"
    assert why["model"] == "key found in the cache"
    changed = _build(capsys, str(recipe), "--set", "quantize.calibration.num_samples=12")
    assert _status(changed)["model"] == "cached"
    assert _status(changed)["quantize"] == "ran"
    assert changed["stages"][1]["key"] != first["stages"][1]["key"]
    # A change of the model stage's input rebuilds the model and everything that reads it.
    (small_model / "generation_config.json").touch()
    os.utime(small_model / "generation_config.json", ns=(1, 1))
    rebuilt = _build(capsys, str(recipe))
    assert _status(rebuilt)["model"] == "ran" and _status(rebuilt)["quantize"] == "ran"


def test_force_reruns_a_cached_stage(tmp_path, cache_dir, small_model, capsys):
    recipe = _recipe(tmp_path, small_model)
    _build(capsys, str(recipe))
    forced = _build(capsys, str(recipe), "--force", "model")
    assert _status(forced)["model"] == "ran"
    assert len(ArtifactCache(cache_dir).entries()) == 1


def test_failed_stage_leaves_nothing(tmp_path, cache_dir, small_model, capsys):
    recipe = _recipe(tmp_path, small_model, QUANTIZE)
    with pytest.raises(SystemExit) as exit_info:
        main(["build", str(recipe), "--set", "quantize.gate.max_perplexity_ratio=1.0000001"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1.0000001" in err
    stages = {e.stage for e in ArtifactCache(cache_dir).entries()}
    assert stages == {"model"}
    assert not list((cache_dir / "quantize").glob(".tmp-*"))


def test_failed_stage_is_reported_in_json(tmp_path, cache_dir, small_model, capsys):
    """CI reads why a build failed from stdout: status, error, and what the stage measured."""
    recipe = _recipe(tmp_path, small_model, QUANTIZE + "draft: {source: none}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["build", str(recipe), "--json", "--set", "quantize.gate.max_perplexity_ratio=1.0000001"])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["status"] == "failed" and "1.0000001" in report["error"]
    assert captured.err.strip() == f"error: {report['error']}"
    stages = {s["name"]: s for s in report["stages"]}
    assert {n: s["status"] for n, s in stages.items()} == {
        "model": "ran", "quantize": "failed", "draft": "skipped", "engine": "skipped", "deploy": "skipped"}
    assert stages["quantize"]["error"] == report["error"] and stages["quantize"]["seconds"] > 0
    quant = stages["quantize"]["metrics"]  # measured before the gate stopped the build
    assert quant["perplexity_ratio"] == pytest.approx(quant["perplexity_quantized"] / quant["perplexity_base"])
    assert quant["perplexity_ratio"] > 1.0000001
    assert stages["draft"]["reason"] == "not run: the quantize stage failed"
    ok = _build(capsys, str(recipe), "--until", "model")
    assert ok["status"] == "ok" and "error" not in ok


def test_sigkill_mid_stage_leaves_no_complete_entry(tmp_path, cache_dir):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: kill\noutput_dir: out\nmodel:\n  tiny: {num_hidden_layers: 1, hidden_size: 32, "
                      "num_attention_heads: 2, num_key_value_heads: 1, intermediate_size: 64, vocab_size: 300, "
                      "seq_len: 32, batch_size: 2, steps: 4000}\n")
    env = {**os.environ, "TRTBUILD_CACHE": str(cache_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "trtbuild.cli", "build", str(recipe), "--json"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list((cache_dir / "model").glob(".tmp-*/hf*")) \
            and not list((cache_dir / "model").glob(".tmp-*/.hf*")):
        time.sleep(0.2)
    time.sleep(1.0)  # well inside the training loop
    assert proc.poll() is None, "the build finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    cache = ArtifactCache(cache_dir)
    assert cache.entries() == []
    assert cache.incomplete(), "the killed build's temp dir should be recognisable as incomplete"
    # The next build plans the stage again (not cached) and gc removes the leftover.
    out = subprocess.run([sys.executable, "-m", "trtbuild.cli", "plan", str(recipe), "--json"], env=env,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["stages"][0]["status"] == "will-run"
    subprocess.run([sys.executable, "-m", "trtbuild.cli", "cache", "gc"], env=env, check=True,
                   capture_output=True)
    assert cache.incomplete() == []
