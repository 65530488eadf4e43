"""End to end on the Maverick rehearsal: recipes/tiny-llama4-cpu.yaml at CI size (a short training
run, a small draft, two bench prompts) built through engine and deploy, served and benched.

Slow (target and draft are trained here). What it shows is the path, not the model's quality: the
engine bundle carries the target as TensorRT-LLM's Llama4ForConditionalGeneration, the CPU Triton
deployment serves it, and plain / EAGLE-3 / n-gram outputs are identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny-llama4-cpu.yaml"
CI_SIZE = ["model.tiny.steps=30", "model.tiny.warmup_steps=5", "model.tiny.seq_len=128",
           "quantize.calibration.num_samples=16", "quantize.calibration.seq_len=128",
           "quantize.gate.eval_samples=8", "quantize.gate.seq_len=128",
           "draft.samples=32", "draft.steps=20", "draft.seq_len=64", "draft.gate.min_acceptance_length=1.0",
           "draft.eval.prompts=1", "draft.eval.new_tokens=32",
           "bench.num_prompts=2", "bench.max_new_tokens=32"]


def _trtbuild(*args: str, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    sets = [arg for item in [f"output_dir={out}", *CI_SIZE] for arg in ("--set", item)]
    return subprocess.run([sys.executable, "-m", "trtbuild.cli", *args, str(RECIPE), *sets, "--json"], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=3600)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[dict, dict[str, str], Path]:
    out = tmp_path_factory.mktemp("llama4-out")
    env = {**os.environ}
    # CI names a cache kept across runs (TRTBUILD_CACHE); without one, a temporary one: never the user's
    env.setdefault("TRTBUILD_CACHE", str(tmp_path_factory.mktemp("cache")))
    proc = _trtbuild("build", out=out, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout), env, out


def test_the_bundle_carries_the_target_as_trtllms_llama4_class(built):
    from trtbuild.core.safetensors_header import read_header

    report, _, out = built
    assert {s["name"]: s["status"] in ("ran", "cached") for s in report["stages"]} == {
        s["name"]: True for s in report["stages"]}
    text = json.loads((out / "quantize" / "hf" / "config.json").read_text())
    served = out / "engine" / "bundle" / "target"
    config = json.loads((served / "config.json").read_text())
    assert config["architectures"] == ["Llama4ForConditionalGeneration"] and config["model_type"] == "llama4"
    assert {k: v for k, v in config["text_config"].items() if k not in ("architectures", "model_type",
                                                                         "quantization_config")} == {
        k: v for k, v in text.items() if k not in ("architectures", "model_type", "quantization_config")}
    names = [n for f in served.glob("*.safetensors") for n in read_header(f)]
    assert names and all(n.startswith("language_model.") for n in names)
    index = json.loads((served / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(index) == sorted(names)
    # the FP8 exclude list keeps the module names TensorRT-LLM matches it against (contract
    # llama4_model.exclude_modules_match: unprefixed), and names the routers
    excluded = json.loads((served / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert "lm_head" in excluded and any(name.endswith("feed_forward.router") for name in excluded)
    assert not any(name.startswith("language_model.") for name in excluded)
    # the quantize stage's own export is untouched (the bundle's files were hard links, replaced)
    assert text["architectures"] == ["Llama4ForCausalLM"]
    assert (out / "deploy" / "deploy.json").is_file()


def test_bench_is_lossless_and_the_server_answers_like_the_runtime(built):
    _, env, out = built
    proc = _trtbuild("bench", out=out, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["outputs_identical"] is True

    from trtbuild.serve.commands import demo

    report = demo(out / "deploy", max_tokens=16, concurrency=(1,), echo=lambda _: None, out_dir=out / "served")
    assert report["outputs_identical"] is True  # server text == in-process text, prompt by prompt
    assert all(level["errors"] == 0 for level in report["levels"])
