"""What a batched step costs, and the closed loop the served model runs, in process.

    python bench/batch_steps.py build/tiny-cpu/quantize/hf build/tiny-cpu/draft/eagle3 --rounds 4

1. One target forward of 7 running sequences (verification rows, draft length 5) and one new
   21-token prompt, as two forwards and as one (`target_groups`, how a request joins the batch).
2. The served model's loop without the server: `TextBatcher` with the held-out bench prompts,
   64 tokens each, a new request as soon as one finishes (closed loop), at concurrency 1 and 8,
   for each draft-length schedule given; every round runs all variants in turn, so a slow spell
   of the machine hits all of them. Prints tokens/s per round and the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from trtbuild.runtime.batch_forward import Layout, RowGroup, target_groups
from trtbuild.runtime.batch_kv import BatchKV
from trtbuild.serve.commands import default_prompts
from trtbuild.serve.textbatch import TextBatcher
from trtbuild.serve.textgen import GenRequest, TextGenerator


def forward_costs(gen: TextGenerator, rounds: int) -> None:
    target = gen.generator.target
    draft = gen.generator.draft
    s = target.spec
    kv = BatchKV(s.num_layers, 8, s.num_kv_heads, s.head_dim, target.dtype, capacity=256)
    running = RowGroup(torch.randint(0, s.vocab_size, (7, 6)), kv.view(0, 7),
                       Layout.causal(torch.full((7,), 100), 6, target.max_positions))
    prompt = RowGroup(torch.randint(0, s.vocab_size, (1, 21)), kv.view(7, 8),
                      Layout.causal(torch.zeros(1, dtype=torch.long), 21, target.max_positions),
                      last=torch.tensor([20]))
    layers = tuple(draft.aux_layers) if draft is not None else ()

    def ms(groups: list[RowGroup]) -> float:
        start = time.perf_counter()
        for _ in range(10):
            target_groups(target, groups, aux_layers=layers)
        return 100 * (time.perf_counter() - start)

    times: dict[str, list[float]] = {"running": [], "prompt": [], "together": []}
    with torch.inference_mode():
        ms([running, prompt])  # warm-up
        for _ in range(rounds * 2):
            times["running"].append(ms([running]))
            times["prompt"].append(ms([prompt]))
            times["together"].append(ms([running, prompt]))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"target forward, 7 sequences x 6 rows: {med['running']:.1f} ms; a 21-token prompt: {med['prompt']:.1f} ms; "
          f"both in one forward: {med['together']:.1f} ms (two forwards: {med['running'] + med['prompt']:.1f} ms)")


def closed_loop(gen: TextGenerator, prompts: list[str], concurrency: int, requests: int,
                schedule: dict[int, int] | None) -> float:
    batcher = TextBatcher(gen, 8, draft_len_schedule=schedule)
    sent = done = tokens = 0
    while sent < concurrency:
        batcher.submit(GenRequest(prompt=prompts[sent % len(prompts)], max_tokens=64), sent)
        sent += 1
    start = time.perf_counter()
    while done < requests:
        for event in batcher.step():
            tokens += len(event.chunk.ids)
            if event.finished:
                done += 1
                if sent < requests:
                    batcher.submit(GenRequest(prompt=prompts[sent % len(prompts)], max_tokens=64), sent)
                    sent += 1
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--draft-len", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--schedules", default='[null, {"4": 5, "8": 4}]',
                        help="JSON list of draft_len_schedule values tried at concurrency 8 (null: none)")
    args = parser.parse_args()
    gen = TextGenerator(args.target, draft_dir=args.draft, max_draft_len=args.draft_len, num_threads=1)
    forward_costs(gen, args.rounds)
    prompts = default_prompts(32)
    variants: list[tuple[str, int, int, dict[int, int] | None]] = [("concurrency 1", 1, 16, None)]
    for schedule in json.loads(args.schedules):
        table = {int(k): int(v) for k, v in schedule.items()} if schedule else None
        variants.append((f"concurrency 8, schedule {schedule}", 8, 64, table))
    closed_loop(gen, prompts, 8, 8, None)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name, *_ in variants}
    for _ in range(args.rounds):
        for name, concurrency, requests, schedule in variants:
            rates[name].append(closed_loop(gen, prompts, concurrency, requests, schedule))
    c1 = statistics.median(rates["concurrency 1"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<40} median {median:6.1f} tokens/s ({median / c1:.2f}x concurrency 1)  rounds: "
              + ", ".join(f"{v:.0f}" for v in values))


if __name__ == "__main__":
    main()
