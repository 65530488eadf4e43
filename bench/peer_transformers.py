"""The peer: transformers' own greedy `generate` and its prompt-lookup decoding, next to trtbuild's
plain, EAGLE-3 and n-gram decoding, on the same model, the same prompts, in the same process.

    python bench/peer_transformers.py BUILD_DIR [--prompts 8] [--new 128] [--draft-len 3] [--repeat 2]

BUILD_DIR is a recipe's output dir (build/tiny-cpu): model/hf (unquantized), quantize/hf (FP8) and
draft/eagle3. transformers cannot run ModelOpt's FP8 export on CPU, so the like-for-like rows use
the unquantized target; trtbuild's FP8 rows are what `trtbuild bench` measures. Every prompt runs
every mode back to back (the CPU is shared; ratios are what carry over). Speeds are decode
tokens/s/user: (new tokens - 1) / (time from the first new token to the last). tau for
transformers' prompt lookup = new tokens / target forwards after the prefill, counted with a hook.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch


class _FirstToken:
    """A transformers streamer that only notes when the first new token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_run(model: Any, prompt: list[int], new: int, lookup: int | None, ngram: int) -> dict[str, Any]:
    forwards = 0

    def count(*_: Any) -> None:
        nonlocal forwards
        forwards += 1

    hook = model.register_forward_hook(count)
    streamer = _FirstToken()
    ids = torch.tensor([prompt])
    kwargs: dict[str, Any] = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False,
                              "attention_mask": torch.ones_like(ids), "pad_token_id": 0, "eos_token_id": None,
                              "streamer": streamer}
    if lookup:
        kwargs.update(prompt_lookup_num_tokens=lookup, max_matching_ngram_size=ngram)
    try:
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)[0, len(prompt):].tolist()
        end = time.perf_counter()
    finally:
        hook.remove()
    decode_s = end - (streamer.first or end)
    return {"tokens": out, "decode_s": decode_s, "forwards": forwards}


def main() -> None:
    from transformers import AutoModelForCausalLM

    from trtbuild.runtime import Generator, SpecParams, load_draft, load_target
    from trtbuild.runtime.bench import load_prompts

    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir", type=Path)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--draft-len", type=int, default=3)
    parser.add_argument("--ngram", type=int, default=2, help="max_matching_ngram_size (both n-gram drafters)")
    parser.add_argument("--repeat", type=int, default=1, help="passes over the prompts (speeds pooled)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base, fp8, draft_dir = (args.build_dir / p for p in ("model/hf", "quantize/hf", "draft/eagle3"))
    prompts = load_prompts("pydoc-heldout", base, args.prompts, args.prompt_len)
    hf = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    ours = {}
    for name, directory in (("fp32", base), ("fp8", fp8)):
        target = load_target(directory)
        ours[name] = Generator(target, load_draft(draft_dir, target) if draft_dir.is_dir() else None)
    k = args.draft_len
    modes: dict[str, Any] = {
        "transformers plain": lambda p: hf_run(hf, p, args.new, None, args.ngram),
        f"transformers prompt lookup k={k}": lambda p: hf_run(hf, p, args.new, k, args.ngram),
        "transformers prompt lookup k=10": lambda p: hf_run(hf, p, args.new, 10, args.ngram),
    }
    for name, gen in ours.items():
        specs = {"plain": None, "n-gram": SpecParams(max_draft_len=k, method="ngram",
                                                        max_matching_ngram_size=args.ngram)}
        if gen.draft is not None:
            specs["EAGLE-3"] = SpecParams(max_draft_len=k)
        for label, spec in specs.items():
            def run(p: list[int], gen: Any = gen, spec: Any = spec) -> dict[str, Any]:
                r = gen.generate(p, args.new, spec=spec, eos_token_ids=[])
                return {"tokens": r.tokens, "decode_s": r.stats.decode_s, "forwards": r.stats.target_forwards,
                        "accepted": r.stats.accepted}
            modes[f"trtbuild {name} {label}"] = run
    for mode in modes.values():  # warm-up
        mode(prompts[0])
    totals = {m: {"tokens": 0, "decode_s": 0.0, "forwards": 0, "steps": 0} for m in modes}
    reference: dict[int, list[int]] = {}
    identical = {m: True for m in modes}
    for _ in range(args.repeat):
        for i, prompt in enumerate(prompts):
            for name, mode in modes.items():
                r = mode(prompt)
                reference.setdefault(i, r["tokens"]) if "fp32" in name or "transformers" in name else None
                if "fp8" not in name:
                    identical[name] &= r["tokens"] == reference[i]
                t = totals[name]
                t["tokens"] += len(r["tokens"]) - 1
                t["decode_s"] += r["decode_s"]
                t["forwards"] += r["forwards"] - 1  # the prefill is not a decode step
                t["steps"] += len(r["tokens"])
    rows = []
    plain_hf = totals["transformers plain"]["tokens"] / totals["transformers plain"]["decode_s"]
    for name, t in totals.items():
        tps = t["tokens"] / t["decode_s"]
        tau = (t["steps"] - args.repeat * len(prompts)) / max(t["forwards"], 1)
        rows.append({"mode": name, "tokens_per_s_per_user": round(tps, 1), "vs_transformers_plain": round(tps / plain_hf, 3),
                     "tau": round(tau, 3), "identical_to_fp32_greedy": identical[name] if "fp8" not in name else None})
    print(json.dumps({"prompts": len(prompts), "new_tokens": args.new, "draft_len": k, "threads": torch.get_num_threads(),
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
