"""In-flight batching in process: tokens/s by batch size, plain and EAGLE-3, and exactness.

    python bench/batch_decode.py build/tiny-cpu/quantize/hf build/tiny-cpu/draft/eagle3 --threads 1

The held-out prompts of the bench, decoded single-stream (`Generator.generate`) and then by the
batch decoder (`trtbuild.runtime.batch`) with 1, 2, 4, 8 sequences at once; every batched output
is compared with its single-stream output token for token.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from trtbuild.runtime import Generator, SpecParams, load_draft, load_target
from trtbuild.runtime.batch import BatchDecoder
from trtbuild.runtime.batch_eagle3 import Eagle3ChainSpeculator
from trtbuild.serve.commands import default_prompts


def decode(gen: Generator, prompts: list[list[int]], tokens: int, batch: int, draft_len: int) -> tuple[list, float]:
    decoder = BatchDecoder(gen.target, batch)
    speculator = Eagle3ChainSpeculator(gen.draft, draft_len, batch) if draft_len else None
    seqs = [decoder.add(p, tokens, speculator=speculator, draft_slack=draft_len) for p in prompts]
    start = time.perf_counter()
    while not decoder.idle:
        decoder.step()
    return [s.emitted for s in seqs], sum(len(s.emitted) for s in seqs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--draft-len", type=int, default=3)
    parser.add_argument("--batches", default="1,2,4,8")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(args.target))
    target = load_target(args.target)
    gen = Generator(target, load_draft(args.draft, target))
    batches = [int(b) for b in args.batches.split(",")]
    prompts = [tokenizer(p)["input_ids"] for p in default_prompts(max(batches), chars=64)]
    alone = [gen.generate(p, args.tokens, spec=SpecParams(max_draft_len=args.draft_len)).tokens for p in prompts]
    decode(gen, prompts[:2], 4, 2, args.draft_len)  # warm-up
    print(f"{'batch':>5}  {'plain tok/s':>11}  {'EAGLE-3 tok/s':>13}  identical to single-stream")
    for batch in batches:
        plain, plain_rate = decode(gen, prompts[:batch], args.tokens, batch, 0)
        spec, spec_rate = decode(gen, prompts[:batch], args.tokens, batch, args.draft_len)
        same = plain == alone[:batch] and spec == alone[:batch]
        print(f"{batch:>5}  {plain_rate:>11.1f}  {spec_rate:>13.1f}  {same}")


if __name__ == "__main__":
    main()
