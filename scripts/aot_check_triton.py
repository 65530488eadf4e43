"""AOT-compile the GEMM plugins' kernels with the Triton that is first on sys.path, and check their SASS.

The Triton TRT-LLM images JIT-compile the bundle's kernels with their own Triton (contract:
release.triton_python: pytorch_triton 3.4.0 in 25.12-26.02, 3.5.1 in 26.04-26.07), not the one trtbuild
builds with. Run this with that version first on PYTHONPATH (no GPU needed), e.g.

    pip install --no-deps --target /tmp/triton-3.5.1 triton==3.5.1
    PYTHONPATH=/tmp/triton-3.5.1:$PWD python scripts/aot_check_triton.py

Prints one JSON object: the Triton version and, per plugin and arch, each variant's FP8 MMA, spills and
problems; exits 1 when a kernel does not compile or its SASS check fails.
"""

from __future__ import annotations

import json
import sys
import tempfile

import triton

from plugins.common.fp8_plugin import PLUGINS

ARCHS = ["sm_90a", "sm_100a"]


def main() -> int:
    out: dict = {"triton": triton.__version__, "plugins": {}, "ok": True}
    for name in ("spatial_partition", "gemm_weight_shuffle"):
        with tempfile.TemporaryDirectory() as directory:
            try:
                report = PLUGINS[name].aot_build(directory, ARCHS)
            except Exception as exc:  # a kernel this Triton cannot build
                out["plugins"][name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                out["ok"] = False
                continue
        out["plugins"][name] = {"ok": report.ok, "kernels": [
            {"arch": k.arch, "variant": k.variant, "mma": k.mma[:1], "spill_bytes": (k.spill_stores or 0)
             + (k.spill_loads or 0), "local_memory_ops": k.local_memory_ops, "problems": k.problems}
            for k in report.kernels]}
        out["ok"] = out["ok"] and report.ok
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
