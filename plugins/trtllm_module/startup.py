"""The one line a server process writes when its model first runs: is the GEMM plugin there, and where.

    trtbuild_gemm: pid 4242, TensorRT-LLM 1.2.1 (convention 1.2.1): 128 FP8 linears patched
    (attention 64, dense 64); spatial_partition: 6144x4096 x32 attention, 4096x4096 x32 attention, ...;
    fallbacks: none; skipped: none

Written through the module's own stderr handler (patch._own_handler): trtllm-serve and Triton's python
backend configure no Python logging, so an info line of a plain logger never shows there. The same
counts go to $TRTBUILD_GEMM_REPORT_DIR/trtbuild_gemm.<pid>.json when that variable is set (the bundle's
launchers set it), for whoever serves the metrics or the model's metadata, and report() has them in-process.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any


def summary(counts: dict[str, int], shapes: dict[tuple[str, str, int, int], int],
            broken: dict[str, str]) -> dict[str, Any]:
    """The counts as plain data (the JSON report, and what the line says)."""
    installed = next((k.split(":", 1)[1] for k in counts if k.startswith("installed:")), None)
    release = next((k.split(":", 1)[1] for k in counts if k.startswith("release:")), None)
    roles: Counter = Counter()
    kernels: dict[str, list[dict[str, Any]]] = {}
    for (kernel, role, n, k), count in sorted(shapes.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0])):
        roles[role] += count
        kernels.setdefault(kernel, []).append({"n": n, "k": k, "role": role, "linears": count})
    return {
        "pid": os.getpid(),
        "installed": installed,
        "convention": release,
        "patched": sum(shapes.values()),
        "roles": dict(roles),
        "kernels": kernels,
        "weights_released": counts.get("weight released", 0),
        "fallbacks": {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("fallback:")},
        "broken": dict(broken),
        "skipped": {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("skipped:")},
    }


def line(data: dict[str, Any]) -> str:
    roles = ", ".join(f"{role} {n}" for role, n in sorted(data["roles"].items())) or "none"
    kernels = "; ".join(
        f"{kernel}: " + ", ".join(f"{s['n']}x{s['k']} x{s['linears']} {s['role']}" for s in shapes)
        for kernel, shapes in data["kernels"].items()) or "no kernel"
    fallbacks = ", ".join(f"{k} ({data['broken'].get(k, '')})".replace(" ()", "") + f" x{v}"
                          for k, v in data["fallbacks"].items()) or "none"
    skipped = ", ".join(f"{k} x{v}" for k, v in sorted(data["skipped"].items())) or "none"
    release = f"TensorRT-LLM {data['installed']} (convention {data['convention']})" if data["convention"] \
        else f"TensorRT-LLM {data['installed']} (not patched)"
    return (f"trtbuild_gemm: pid {data['pid']}, {release}: {data['patched']} FP8 linears patched ({roles}); "
            f"{kernels}; weights: {data['weights_released']} TensorRT-LLM copies released; "
            f"fallbacks: {fallbacks}; skipped: {skipped}")


def announce(log: logging.Logger, counts: dict[str, int], shapes: dict[tuple[str, str, int, int], int],
             broken: dict[str, str]) -> dict[str, Any]:
    data = summary(counts, shapes, broken)
    log.warning(line(data))
    directory = os.environ.get("TRTBUILD_GEMM_REPORT_DIR")
    if directory:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            path = Path(directory) / f"trtbuild_gemm.{data['pid']}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
            tmp.replace(path)
        except OSError as exc:
            log.warning("trtbuild_gemm: cannot write the report under %s (%s)", directory, exc)
    return data
