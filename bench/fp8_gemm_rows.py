"""The runtime's exact FP8 GEMM by row count: nine int8 plane GEMMs vs one float64 GEMM of the same integers.

    python bench/fp8_gemm_rows.py [--threads 1] [--rows 1,6,12,24,48]

trtbuild.runtime.fp8_exact computes fp8(x * inv) . w_fp8 exactly. Below ROWS_FOR_FLOAT64 rows it splits
both operands into int8 planes (3 bytes a weight to stream); from there on it multiplies the same
integers in float64, exact in any summation order. For each shape (SmolLM2-135M's and the tiny
target's linears) and row count this times both forms on the same inputs, checks they give the same
bits, and prints the milliseconds and the float64 / int8 ratio: below 1, float64 is faster. Weights are
hot in cache (one matrix per shape), which flatters float64 at small row counts; the runtime switches
at 12 rows, where float64 wins for every shape here.
"""

from __future__ import annotations

import argparse

import torch
from gemm_rows import micros

from trtbuild.runtime import fp8_exact

SHAPES = [("smollm2 gate|up", 1536, 576), ("smollm2 down", 576, 1536), ("smollm2 k|v", 192, 576),
          ("tiny gate|up", 1536, 256), ("tiny down", 256, 768)]


def forced(gemm: fp8_exact.ExactFp8Gemm, x: torch.Tensor, threshold: int) -> torch.Tensor:
    """The runtime's GEMM with its switch moved: 1 << 30 keeps the int8 planes, 1 takes float64."""
    saved, fp8_exact.ROWS_FOR_FLOAT64 = fp8_exact.ROWS_FOR_FLOAT64, threshold
    try:
        return gemm(x)
    finally:
        fp8_exact.ROWS_FOR_FLOAT64 = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,6,12,24,48")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'shape (N x K)':24}{'rows':>6}{'int8 planes ms':>16}{'float64 ms':>12}{'ratio':>8}")
    for name, n, k in SHAPES:
        weight = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.05
        scale = weight.abs().max() / fp8_exact.FP8_MAX
        grid = (weight / scale).clamp(-fp8_exact.FP8_MAX, fp8_exact.FP8_MAX).to(fp8_exact.FP8)
        planes = fp8_exact.ExactFp8Gemm(grid, torch.full((n,), float(scale)), torch.tensor(448 / 3.0))

        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            if not torch.equal(forced(planes, x, 1 << 30), forced(planes, x, 1)):
                raise SystemExit(f"{name} at {rows} rows: the two forms differ")
            int8_ms = micros(lambda g=planes, x=x: forced(g, x, 1 << 30), repeat=30) / 1e3
            f64_ms = micros(lambda g=planes, x=x: forced(g, x, 1), repeat=30) / 1e3
            print(f"{name + f' ({n}x{k})':24}{rows:>6}{int8_ms:>16.3f}{f64_ms:>12.3f}{f64_ms / int8_ms:>8.2f}")


if __name__ == "__main__":
    main()
