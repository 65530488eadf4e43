"""Speedup and tau of several drafting shapes on one target/draft pair (each measured side by side
with plain decoding, so every ratio is taken under the same CPU load).

    python bench/runtime_sweep.py TARGET_DIR DRAFT_DIR [--threads 1] [--prompts 8] [--new 128]
        [--shapes chain:3 chain:5:0.4 tree:5:2:8 ...]
        (chain:DEPTH[:MIN_DRAFT_PROB], tree:DEPTH:TOPK:TOKENS)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trtbuild.runtime.bench import BenchConfig, run_bench

DEFAULT_SHAPES = ["chain:3", "chain:4", "chain:5", "chain:6", "tree:5:2:8", "tree:6:2:10", "tree:5:3:12"]


def config_for(shape: str, args: argparse.Namespace) -> BenchConfig:
    parts = shape.split(":")
    common = dict(num_prompts=args.prompts, prompt_len=args.prompt_len, max_new_tokens=args.new,
                  threads=args.threads, warmup=1, draft_norm=args.draft_norm)
    if parts[0] == "chain":  # chain:DEPTH[:MIN_DRAFT_PROB]
        prob = float(parts[2]) if len(parts) > 2 else 0.0
        return BenchConfig(tree="chain", max_draft_len=int(parts[1]), min_draft_prob=prob, **common)
    depth, topk, tokens = (int(p) for p in parts[1:])
    return BenchConfig(tree="dynamic", max_draft_len=depth, topk=topk, max_total_draft_tokens=tokens,
                       **common)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--draft-norm", default="standard")
    parser.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES)
    parser.add_argument("--out", type=Path, default=None, help="write each report as OUT/<shape>.json/.png")
    args = parser.parse_args()
    for shape in args.shapes:
        out = args.out / f"{shape.replace(':', '_')}.json" if args.out else None
        r = run_bench(args.target, args.draft, None, config_for(shape, args), out_path=out)
        s, p = r["speculative"], r["plain"]
        print(json.dumps({
            "shape": shape, "speedup": round(r["speedup"], 3), "tau": round(s["acceptance_length"], 3),
            "plain_tps": round(p["tokens_per_s_per_user"], 1),
            "spec_tps": round(s["tokens_per_s_per_user"], 1), "identical": r["outputs_identical"],
            "ms_draft_per_step": round(s["profile"]["ms_per_step_draft"], 2),
            "ms_target_per_step": round(s["profile"]["ms_per_step_target"], 2),
            "ms_plain_per_token": round(p["ms_per_target_forward"], 2),
            "ttft_ms": [round(1e3 * p["ttft_s"], 1), round(1e3 * s["ttft_s"], 1)],
        }), flush=True)


if __name__ == "__main__":
    main()
