#!/usr/bin/env python
"""Benchmark the FP8 GEMM plugins on one GPU: correctness vs torch, time vs torch._scaled_mm and
vs the device's measured copy bandwidth.

    python scripts/gpu_bench.py                      # full table, <= 8 minutes on an H100/H200
    python scripts/gpu_bench.py --quick              # 3 shapes x M = 1, 4, 16
    python scripts/gpu_bench.py --out bench/gpu-plugins.md      # bench/RESULTS.md links to it
    python scripts/gpu_bench.py --dry-run            # CPU: Triton interpreter on one small shape

For each linear shape (Llama-3 8B / 70B) and M tokens it checks every plugin's kernel against a
float32 torch reference, then times it and torch._scaled_mm (per-tensor scales, bf16 out) inside
CUDA graphs over enough weight copies to keep the weights out of L2. Reported per row:
  GB/s      weight + activation bytes / time
  % copy    GB/s / device-to-device copy bandwidth (2 x bytes / time of a 512 MiB copy)
  speedup   torch._scaled_mm time / plugin time
Goals (issue 6): >= 85% of copy bandwidth at M = 1, and >= 1.3x torch._scaled_mm.
Every shape and plugin runs in its own try/except: a failure is a row, never the end of the run.
Exit status: 0 when every check passed, 1 when some row failed or errored.
"""

from __future__ import annotations

import argparse
import functools
import math
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the top-level plugins/ package lives beside trtbuild/

SHAPES = [  # (name, N, K) of y = x W^T, W [N, K]
    ("8B qkv/o", 4096, 4096),
    ("8B gate/up", 14336, 4096),
    ("8B down", 4096, 14336),
    ("70B o", 8192, 8192),
    ("70B gate/up", 28672, 8192),
]
QUICK_SHAPES = [SHAPES[0], SHAPES[1], SHAPES[3]]
MS = [1, 2, 4, 8, 16]
QUICK_MS = [1, 4, 16]
DRY_SHAPES = [("dry-run", 320, 384)]  # ragged in N vs the 128-row tile
DRY_MS = [1, 3]
GOAL_COPY_FRACTION = 0.85
GOAL_SPEEDUP = 1.3


@dataclass
class Row:
    plugin: str
    shape: str
    n: int
    k: int
    m: int
    check: str = "-"
    ours_s: float | None = None
    mm_s: float | None = None
    bytes_moved: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.check != "ok"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- timing -----------------------------------------------------------------------------------

def time_per_call(calls: list[Callable[[], object]], device: object, min_time_s: float) -> tuple[float, str]:
    """Best-of-3 seconds per call of `calls` (each on its own weight copy). CUDA: in a CUDA graph
    (eager if capture fails); CPU: perf_counter."""
    import torch

    for c in calls:  # warm-up: compiles, autotunes, allocates
        c()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t0) / len(calls), "cpu"
    torch.cuda.synchronize()
    mode = "graph"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        run: Callable[[], object] = graph.replay
    except Exception as exc:  # capture can fail (e.g. a host sync in a baseline): time eagerly
        mode = f"eager ({type(exc).__name__})"
        torch.cuda.synchronize()

        def run() -> None:
            for c in calls:
                c()
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) / 1e3, 1e-7)
    reps = max(3, min(500, math.ceil(min_time_s / once)))
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / (reps * len(calls)))
    return best, mode


def copy_bandwidth(device: object, min_time_s: float) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting the read and the write."""
    import torch

    nbytes = (512 << 20) if device.type == "cuda" else (64 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t, _ = time_per_call([lambda: dst.copy_(src)], device, min_time_s)
    return 2 * nbytes / t


# --- one shape ----------------------------------------------------------------------------------

def random_fp8(shape: tuple[int, ...], device: object, gen_scale: float) -> tuple[object, object]:
    """An e4m3 tensor quantized on the host side of the kernel (torch), and its per-tensor scale."""
    import torch

    from plugins.common.reference import FP8_MAX, quantize_fp8

    values = torch.randn(shape, device=device) * gen_scale
    scale = (values.abs().amax() / FP8_MAX).clamp(min=1e-12).float()
    return quantize_fp8(values, scale), scale


def scaled_mm_call(x, w, sx, sw):  # noqa: ANN001, ANN201 - torch objects
    """torch._scaled_mm for y = x W^T; cuBLASLt wants M % 16 on some versions: pad then slice."""
    import torch

    try:
        y = torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        return (lambda: torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)), y, ""
    except RuntimeError:
        m = x.shape[0]
        xp = torch.zeros(((m + 15) // 16) * 16, x.shape[1], dtype=torch.uint8, device=x.device)
        xp[:m] = x.view(torch.uint8)
        xp = xp.view(x.dtype)

        def call():  # noqa: ANN202
            return torch._scaled_mm(xp, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        return call, call()[:m], "_scaled_mm needed M padded to 16"


def bench_shape(name: str, n: int, k: int, ms: list[int], plugin_names: list[str], arch: str,
                device: object, l2_bytes: int, min_time_s: float) -> list[Row]:
    import torch

    from plugins.common.layout import shuffle
    from trtbuild.core import plugins

    rows: list[Row] = []
    try:
        torch.manual_seed(n * 7 + k)
        w, sw = random_fp8((n, k), device, 0.05)
        copies = 1 if device.type != "cuda" else max(2, min(16, math.ceil(3 * l2_bytes / (n * k))))
        w_copies = [w] + [w.clone() for _ in range(copies - 1)]
        shuffled: dict[str, list[object]] = {}
        for p in plugin_names:
            bn, bk = plugins.get(p).tile_for(arch)
            shuffled.setdefault(f"{bn}x{bk}", [shuffle(c, bn, bk) for c in w_copies])
    except Exception as exc:
        log(f"{name}: setup failed: {exc!r}")
        return [Row(p, name, n, k, m, check=f"error: {type(exc).__name__}: {exc}"[:120])
                for m in ms for p in plugin_names]

    for m in ms:
        try:
            x, sx = random_fp8((m, k), device, 1.0)
            ref = (x.float() @ w.float().t()) * (sx * sw)
            tol = 1e-2 * float(ref.abs().max()) + 1e-6
        except Exception as exc:
            rows += [Row(p, name, n, k, m, check=f"error: {type(exc).__name__}: {str(exc)[:100]}")
                     for p in plugin_names]
            continue
        mm_s, mm_note, mm_ok = None, "", True
        try:
            mm_call, mm_y, mm_note = scaled_mm_call(x, w, sx, sw)
            mm_ok = bool(((mm_y.float() - ref).abs() <= tol + 1e-2 * ref.abs()).all())
            mm_calls = [scaled_mm_call(x, c, sx, sw)[0] for c in w_copies[1:]]
            mm_s, _ = time_per_call([mm_call, *mm_calls], device, min_time_s)
        except Exception as exc:
            mm_note = f"_scaled_mm: {type(exc).__name__}: {str(exc)[:80]}"
        for p in plugin_names:
            plugin = plugins.get(p)
            row = Row(p, name, n, k, m, mm_s=mm_s, bytes_moved=n * k + m * k + 2 * m * n)
            if mm_note:
                row.notes.append(mm_note)
            if not mm_ok:
                row.notes.append("_scaled_mm disagrees with the reference")
            try:
                bn, bk = plugin.tile_for(arch)
                tiles = shuffled[f"{bn}x{bk}"]
                y = plugin.kernel(x, tiles[0], sx, sw, n, k, torch.bfloat16)
                err = (y.float() - ref).abs()
                ok = bool((err <= tol + 1e-2 * ref.abs()).all())
                row.check = "ok" if ok else f"FAIL max err {float(err.max()):.3g}"
                calls = [functools.partial(plugin.kernel, x, t, sx, sw, n, k, torch.bfloat16) for t in tiles]
                row.ours_s, mode = time_per_call(calls, device, min_time_s)
                if mode not in ("graph", "cpu"):
                    row.notes.append(f"timed {mode}")
            except Exception as exc:
                row.check = f"error: {type(exc).__name__}: {str(exc)[:100]}"
                log(f"{p} {name} M={m}: {traceback.format_exc(limit=3)}")
            rows.append(row)
            log(f"{p:20s} {name:12s} M={m:<3d} {row.check}")
    return rows


# --- report -------------------------------------------------------------------------------------

def fmt_us(s: float | None) -> str:
    return f"{s * 1e6:.1f}" if s is not None else "-"


def table(rows: list[Row], copy_bw: float) -> list[str]:
    out = ["| plugin | shape | N x K | M | check | plugin us | _scaled_mm us | plugin GB/s | % copy BW "
           "| speedup | notes |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gbps = r.bytes_moved / r.ours_s / 1e9 if r.ours_s else None
        pct = f"{100 * r.bytes_moved / r.ours_s / copy_bw:.0f}%" if r.ours_s else "-"
        speed = f"{r.mm_s / r.ours_s:.2f}x" if r.ours_s and r.mm_s else "-"
        check = r.check.replace("|", "/")
        out.append(f"| {r.plugin} | {r.shape} | {r.n}x{r.k} | {r.m} | {check} | {fmt_us(r.ours_s)} | "
                   f"{fmt_us(r.mm_s)} | {f'{gbps:.0f}' if gbps else '-'} | {pct} | {speed} | "
                   f"{'; '.join(r.notes).replace('|', '/')} |")
    return out


def summary(rows: list[Row], copy_bw: float, plugin_names: list[str]) -> list[str]:
    lines = []
    for p in plugin_names:
        mine = [r for r in rows if r.plugin == p and r.ours_s and not r.failed]
        m1 = [r.bytes_moved / r.ours_s / copy_bw for r in mine if r.m == 1]
        speed = [r.mm_s / r.ours_s for r in mine if r.mm_s]
        if not mine:
            lines.append(f"- {p}: no successful rows")
            continue
        geo = math.exp(sum(math.log(s) for s in speed) / len(speed)) if speed else float("nan")
        m1_text = (f"M=1: {100 * min(m1):.0f}%..{100 * max(m1):.0f}% of copy bandwidth "
                   f"({sum(f >= GOAL_COPY_FRACTION for f in m1)}/{len(m1)} shapes >= "
                   f"{100 * GOAL_COPY_FRACTION:.0f}%)") if m1 else "M=1: not measured"
        lines.append(f"- {p}: {m1_text}; vs torch._scaled_mm: geomean {geo:.2f}x, "
                     f"{sum(s >= GOAL_SPEEDUP for s in speed)}/{len(speed)} rows >= {GOAL_SPEEDUP}x")
    failed = [r for r in rows if r.failed]
    lines.append(f"- correctness: {len(rows) - len(failed)}/{len(rows)} rows ok")
    return lines


# --- main ---------------------------------------------------------------------------------------

def parse_shapes(text: str) -> list[tuple[str, int, int]]:
    shapes = []
    for part in text.split(","):
        try:
            n, k = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape '{part}' is not NxK") from None
        shapes.append((f"{n}x{k}", n, k))
    return shapes


def parse_ms(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of integers") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 shapes x M = 1, 4, 16")
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, one small shape")
    ap.add_argument("--shapes", type=parse_shapes, help="NxK,... (overrides the shape list)")
    ap.add_argument("--ms", type=parse_ms, help="M values, e.g. 1,2,4")
    ap.add_argument("--plugins", default="gemm_weight_shuffle,spatial_partition")
    ap.add_argument("--arch", help="tile layout to use (default: the GPU's; sm_90a for --dry-run)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting new shapes after this many seconds (default 420)")
    ap.add_argument("--min-time-s", type=float, default=0.02, help="GPU time per measurement trial")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) to this file")
    args = ap.parse_args(argv)

    import torch
    import triton

    from plugins.common.arch import arch_of_capability, canonical_arch
    from trtbuild.core import plugins

    started = time.monotonic()
    if args.dry_run:
        device = torch.device("cpu")
        shapes, ms = args.shapes or DRY_SHAPES, args.ms or DRY_MS
    else:
        if not torch.cuda.is_available():
            log("no CUDA device (use --dry-run on a CPU host)")
            return 2
        device = torch.device("cuda")
        shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
        ms = args.ms or (QUICK_MS if args.quick else MS)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_name, l2 = props.name, int(getattr(props, "L2_cache_size", 50 << 20))
        gpu_arch = arch_of_capability(*torch.cuda.get_device_capability(device))
    else:
        device_name, l2, gpu_arch = f"CPU ({platform.processor() or platform.machine()})", 0, None
    arch = canonical_arch(args.arch or gpu_arch or "sm_90a")
    plugin_names = []
    for p in args.plugins.split(","):
        problems = plugins.get(p).compatibility_problems(arch=arch)
        if problems:
            log(f"skipping {p}: {problems[0]}")
        else:
            plugin_names.append(p)
    log(f"device: {device_name}, tiles for {arch}; plugins: {', '.join(plugin_names) or 'none'}")

    copy_bw = copy_bandwidth(device, args.min_time_s)
    log(f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s")
    rows: list[Row] = []
    for name, n, k in shapes:
        if time.monotonic() - started > args.budget_s:
            log(f"time budget {args.budget_s:.0f}s spent: skipping {name}")
            rows += [Row(p, name, n, k, m, check="skipped (time budget)") for m in ms for p in plugin_names]
            continue
        rows += bench_shape(name, n, k, ms, plugin_names, arch, device, l2, args.min_time_s)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    what = "dry run, CPU interpreter" if args.dry_run else device_name
    timing = ("CUDA graphs over weight copies that overflow L2, best of 3" if device.type == "cuda"
              else "wall clock (interpreter; not a performance number)")
    header = [f"# FP8 GEMM plugins vs torch._scaled_mm ({what})",
              "",
              f"- device: {device_name}; torch {torch.__version__}; triton {triton.__version__}; "
              f"tiles {arch}",
              f"- device-to-device copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write of a "
              f"{'512' if device.type == 'cuda' else '64'} MiB buffer)",
              f"- timing: {timing}",
              f"- wall time of this run: {time.monotonic() - started:.0f} s",
              ""]
    text = "\n".join(header + table(rows, copy_bw) + ["", "Summary:"] + summary(rows, copy_bw, plugin_names))
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(args.out)
    return 1 if any(r.failed and not r.check.startswith("skipped") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
