"""End to end with NVFP4: recipes/tiny-cpu.yaml with `--set quantize.format=nvfp4`, built for real,
benched and served on CPU (issue 36).

NVFP4 runs on Blackwell only, so the deployment targets sm_100a (`gpu_archs`, and the GEMM plugin's
kernel named for sm_100a alone; the plugins take none of NVFP4's GEMMs). The quantize stage runs
ModelOpt's NVFP4_DEFAULT_CFG on CPU, the runtime executes the export with the exact NVFP4 linear,
so plain, EAGLE-3 and n-gram decoding give the same text, and the local Triton model serves it.
In `make test` (marked e2e): the recipe's training is shortened (`SHORT`), since what is under test is
NVFP4 through every stage, not the draft's quality; the full recipe's NVFP4 numbers are bench/nvfp4.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny-cpu.yaml"
NVFP4 = ("--set", "quantize.format=nvfp4", "--set", "gpu_archs=[sm_100a]",
         "--set", "engine.gemm_plugin.kernels={sm_100a: spatial_partition}")
# Seconds instead of minutes of training (model 129 s + draft 195 s at the recipe's settings) and short
# measurements (every NVFP4 forward is the exact W4A4 runtime's): enough for a model whose text NVFP4
# changes and a draft that proposes tokens; the draft's quality is not this test's subject.
SHORT = ("--set", "model.tiny.steps=60", "--set", "quantize.calibration.num_samples=16",
         "--set", "quantize.gate.eval_samples=8", "--set", "draft.steps=60", "--set", "draft.samples=128",
         "--set", "draft.gate.min_acceptance_length=1.0", "--set", "draft.eval.prompts=2",
         "--set", "draft.eval.new_tokens=32", "--set", "bench.num_prompts=2", "--set", "bench.max_new_tokens=32")


def _trtbuild(*args: str, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtbuild.cli", *args, *NVFP4, *SHORT,
                           "--set", f"output_dir={out}"],
                          env=env, capture_output=True, text=True, cwd=REPO, timeout=3600)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, str], Path]:
    out = tmp_path_factory.mktemp("tiny-nvfp4-out")
    env = {**os.environ}
    # CI names a cache kept across runs (TRTBUILD_CACHE); without one, a temporary one: never the user's
    env.setdefault("TRTBUILD_CACHE", str(tmp_path_factory.mktemp("cache")))
    proc = _trtbuild("build", str(RECIPE), "--json", out=out, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout), env, out


def test_the_nvfp4_build_serves_and_benches_losslessly(built: tuple[dict, dict[str, str], Path]) -> None:
    report, env, out = built
    stages = {s["name"]: s for s in report["stages"]}
    quantize = stages["quantize"]["metrics"]
    assert quantize["format"] == "nvfp4" and quantize["export_check"] == "passed"
    assert quantize["perplexity_ratio"] <= quantize["max_perplexity_ratio"]
    quant = json.loads((out / "quantize" / "hf" / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["group_size"]) == ("NVFP4", 16)
    bundle = json.loads((out / "engine" / "bundle" / "bundle.json").read_text())
    assert bundle["gpu_archs"] == ["sm_100a"]

    proc = _trtbuild("bench", str(RECIPE), "--json", out=out, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    bench = json.loads(proc.stdout)
    assert bench["target_quant_algo"] == "NVFP4"
    assert bench["outputs_identical"] is True  # plain == EAGLE-3 == n-gram, prompt by prompt

    from trtbuild.serve.commands import demo

    lines: list[str] = []
    served = demo(out / "deploy", max_tokens=16, concurrency=(1,), echo=lines.append, out_dir=out / "served")
    assert served["outputs_identical"] is True  # server text == in-process text on the NVFP4 export
    assert all(level["errors"] == 0 for level in served["levels"])
