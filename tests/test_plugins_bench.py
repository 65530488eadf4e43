"""scripts/gpu_bench.py on this CPU host: the same steps through the Triton interpreter."""

from __future__ import annotations

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
