"""Where a decode step's time goes, in CPU time of this thread (robust to a shared, busy CPU).

    python bench/runtime_profile.py TARGET_DIR DRAFT_DIR [--threads 1] [--context 128]

Prints ms per target forward for 1..24 new tokens (plain decode = 1; verification of a draft
tree of N tokens = N+1), ms per draft forward for 1..8 rows, the fc projection, and the
op-level split (GEMM vs the rest) of a single-token target forward.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from trtbuild.runtime import load_draft, load_target
from trtbuild.runtime.target import causal_mask


def cpu_ms(fn, repeat: int = 15, blocks: int = 5) -> float:
    """Best of `blocks` averages: other processes only ever add time (cache evictions)."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(blocks):
        start = time.thread_time()
        for _ in range(repeat):
            fn()
        best = min(best, (time.thread_time() - start) / repeat * 1e3)
    return best


def op_split(target, cache, context: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    ids = torch.tensor([[5]])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(30):
            target.forward(ids, cache, context)
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    gemm = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in ("aten::mm", "aten::addmm"))
    attn = sum(e.self_cpu_time_total for e in prof.key_averages() if "attention" in e.key)
    return {"gemm_share": gemm / total, "attention_share": attn / total,
            "other_share": 1 - (gemm + attn) / total}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    draft = load_draft(args.draft, target)
    n = args.context
    result: dict[str, object] = {"threads": args.threads, "context": n}
    with torch.inference_mode():
        tcache, dcache = target.new_cache(1, n + 64), draft.new_cache(1, n + 64)
        target.forward(torch.arange(n).view(1, -1) % target.vocab_size, tcache, 0)
        for m in (1, 2, 4, 6, 8, 12, 16, 24):
            ids = torch.arange(m).view(1, -1)
            mask = causal_mask(m, n)
            result[f"target_ms_{m}"] = cpu_ms(lambda ids=ids, mask=mask: target.forward(
                ids, tcache, n, mask=mask, aux_layers=draft.aux_layers))
        hidden = torch.randn(1, 1, target.spec.hidden_size, dtype=draft.dtype)
        for m in (1, 2, 4, 8):
            h, ids, mask = hidden.expand(1, m, -1), torch.arange(m).view(1, -1), causal_mask(m, n)
            result[f"draft_ms_{m}"] = cpu_ms(lambda h=h, ids=ids, mask=mask: draft.forward(h, ids, dcache, n,
                                                                                           mask=mask))
        aux = torch.randn(1, 1, len(draft.aux_layers) * target.spec.hidden_size, dtype=target.dtype)
        result["fc_ms"] = cpu_ms(lambda: draft.project(aux))
        result.update(op_split(target, tcache, n))
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
