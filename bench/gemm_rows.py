"""Cost of one GEMM as the number of rows grows, for the tiny target's linear shapes.

    python bench/gemm_rows.py [--threads 1]

Speculative decoding pays off when verifying k tokens costs about as much as decoding one (a
weight-bandwidth-bound GPU). This prints, for 1, 6 and 16 rows, the microseconds of x @ W_t
(the runtime's layout) and F.linear, in float32 and float64, weights hot in cache, and the ratio
of 6 rows to 1 row: near 1 means memory-bound (speculation is cheap), near 6 compute-bound.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = [("q|k|v", 256, 512), ("gate|up", 256, 1536), ("down", 768, 256), ("lm_head", 256, 2048)]
ROWS = (1, 6, 16)


def micros(fn, repeat: int = 300) -> float:
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; microseconds per call (best of 3)")
    print(f"{'dtype':8} {'shape':8} {'K x N':>10} " + " ".join(f"{'@ ' + str(m):>8} {'lin ' + str(m):>8}"
                                                         for m in ROWS) + "   6 rows / 1 row")
    for dtype in (torch.float32, torch.float64):
        for name, k, n in SHAPES:
            w_t = torch.randn(k, n, dtype=dtype)
            w = w_t.t().contiguous()
            cells, at = [], {}
            for m in ROWS:
                x = torch.randn(1, m, k, dtype=dtype)
                at[m] = micros(lambda x=x, w_t=w_t: x @ w_t)
                cells += [at[m], micros(lambda x=x, w=w: F.linear(x, w))]
            print(f"{str(dtype).removeprefix('torch.'):8} {name:8} {f'{k}x{n}':>10} "
                  + " ".join(f"{c:8.1f}" for c in cells) + f"   {at[6] / at[1]:.1f}x")


if __name__ == "__main__":
    main()
