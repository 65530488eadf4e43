"""scripts/gpu_bench.py on this CPU host: the same steps through the Triton interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]


def test_dry_run_checks_and_times_every_plugin_and_survives_a_bad_shape(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    # 0x64 cannot be built: its rows must say so while the good shape still runs to the end.
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_bench.py"), "--dry-run",
                           "--shapes", "0x64,320x384", "--ms", "1,3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]  # a row failed, the run did not crash
    text = out.read_text()
    assert text == proc.stdout and "copy bandwidth" in text
    table = rows(text)
    plugin_names = ("gemm_weight_shuffle", "spatial_partition")
    assert [(r[0], r[1], r[3]) for r in table] == [
        (p, shape, m) for shape in ("0x64", "320x384") for m in ("1", "3") for p in plugin_names]
    for r in table:
        if r[1] == "0x64":
            assert r[4].startswith("error:")
            continue
        assert r[4] == "ok"  # the kernel agrees with the float32 torch reference
        assert float(r[5]) > 0 and float(r[6]) > 0  # plugin and torch._scaled_mm both timed
        assert r[9].endswith("x")
    assert "correctness: 4/8 rows ok" in text


def test_gpu_check_without_cuda_is_one_line_and_exit_3() -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                            "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout == "no CUDA device\n" and proc.stderr == ""
    assert not list((ROOT / "bench").glob("gpu-*.md.kernels"))  # nothing half-written


def test_runtime_check_dry_run_measures_plain_and_speculative_per_gemm() -> None:
    """Section 2's script on CPU (tiny shapes): the op's torch reference vs the dequantized GEMM, plain
    and with the random EAGLE-3 draft; on CUDA the same rows time the kernels vs torch._scaled_mm."""
    # Run in-process under runpy to list what it imported: a GPU machine has torch, triton and
    # transformers (with its dependencies) but no ModelOpt, TensorRT-LLM, datasets or Triton clients.
    wrapper = ("import json, runpy, sys\nsys.argv = sys.argv[1:]\ntry:\n"
               "    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as exit:\n"
               "    code = exit.code\nprint(json.dumps([code, sorted({m.split('.')[0] for m in sys.modules})]))")
    proc = subprocess.run([sys.executable, "-c", wrapper, str(ROOT / "scripts" / "gpu_runtime_check.py"),
                           "--dry-run", "--layers", "2", "--new-tokens", "6"], capture_output=True, text=True,
                          timeout=600)
    code, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not {"modelopt", "tensorrt_llm", "datasets", "pytriton", "tritonclient", "pydantic"} & set(modules)
    table = rows(proc.stdout)
    assert [(r[0], r[1]) for r in table] == [(m, d) for m in ("reference", "off")
                                            for d in ("plain", "speculative k=3")]
    for mode, _, wall, per_user, tau, forwards, on_op in table:
        assert float(wall) > 0 and float(per_user) > 0 and float(tau) >= 1.0 and int(forwards) >= 1
        assert int(on_op) == (4 if mode == "reference" else 0)  # o_proj + down_proj of 2 layers


def test_draft_train_check_dry_run_times_the_stage_loop() -> None:
    """Section 3's script on CPU (tiny shapes, float32): the draft stage's own training loop, timed per
    step through its progress callback; on CUDA the same row is a ~1B target in bf16."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_draft_train_check.py"), "--dry-run",
                           "--warm-steps", "1", "--steps", "2", "--batch-size", "2", "--seq-len", "32"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = rows(proc.stdout)
    assert row[0] == "one process, cpu" and row[3] == "n/a"
    ms, tokens = float(row[1]), float(row[2].replace(",", ""))
    assert ms > 0 and abs(tokens - 2 * 32 / (ms / 1e3)) <= 0.01 * tokens + 1
