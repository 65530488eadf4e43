"""How fast the target writes the draft's training answers on this CPU: float32 vs bfloat16, by batch size,
side by side in one run (issue 34: the answers phase is the long run's largest cost).

    python bench/draft_generation.py TARGET_HF_DIR [--batches 32,64,128] [--tokens 64] [--rows 128]
        [--dtypes float32,bfloat16] [--attention sdpa,trtbuild_sdpa_gqa]

Each setting continues the same chat requests (tests/data/chat_train.jsonl, rendered as the served
endpoint renders them) greedily with the draft stage's own `greedy_fill`, after one warm-up call.
Prints generated tokens per second per setting, each ratio to the first setting at the same batch size,
and how often a setting's continuation equals that one's token for token (greedy decoding in two
precisions diverges once two logits tie within rounding; two attention kernels that sum alike do not).
`--attention`: transformers' `sdpa` repeats grouped K/V under the padding mask, the stage's
`trtbuild_sdpa_gqa` does not. One JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

CHATS = Path(__file__).resolve().parent.parent / "tests" / "data" / "chat_train.jsonl"


def chat_prompts(model_dir: Path, rows: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from trtbuild.core.data.chat import chat_prompt_ids, request_messages
    from trtbuild.core.data.sources import TextSource, load_records

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    records = [r for r in load_records(TextSource.model_validate(str(CHATS)), "train")
               if isinstance(r, list)]
    prompts = [chat_prompt_ids(tokenizer, request_messages(r)) for r in records]
    return [prompts[i % len(prompts)] for i in range(rows)]


def main() -> None:
    from trtbuild.draft.data import greedy_fill, load_target

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--batches", default="32,64,128")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per row")
    parser.add_argument("--rows", type=int, default=128, help="rows generated per setting")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--attention", default="sdpa,trtbuild_sdpa_gqa",
                        help="transformers attn_implementation values; trtbuild_sdpa_gqa is the stage's")
    args = parser.parse_args()
    torch.set_num_threads(2)
    prompts = chat_prompts(args.target, args.rows)
    seq_len = max(len(p) for p in prompts) + args.tokens
    results: dict[str, dict[str, float]] = {}
    outputs: dict[str, torch.Tensor] = {}
    baseline: dict[int, str] = {}  # batch -> the first setting run at that batch size
    for dtype_name in args.dtypes.split(","):
        for attention in args.attention.split(","):
            model = load_target(args.target, dtype=getattr(torch, dtype_name), attention=attention)
            greedy_fill(model, prompts[:4], min(len(p) for p in prompts[:4]) + 4)  # warm-up
            for batch in (int(b) for b in args.batches.split(",")):
                name = f"{dtype_name} {attention} batch {batch}"
                start, rows = time.perf_counter(), []
                for first in range(0, len(prompts), batch):
                    rows.append(greedy_fill(model, prompts[first:first + batch], seq_len))
                seconds = time.perf_counter() - start
                outputs[name] = torch.cat(rows)
                generated = sum(seq_len - len(p) for p in prompts)
                results[name] = {"seconds": round(seconds, 2), "tokens_per_s": round(generated / seconds, 1)}
                twin = baseline.setdefault(batch, name)
                if twin != name:
                    results[name]["speedup_vs_" + twin.replace(" ", "_")] = round(results[twin]["seconds"] / seconds, 2)
                    results[name]["rows_equal"] = round(float((outputs[name] == outputs[twin]).all(1).float().mean()), 3)
                print(name, results[name], flush=True)
    print(json.dumps({"target": str(args.target), "rows": args.rows, "new_tokens": args.tokens,
                      "settings": results}, indent=1))

if __name__ == "__main__":
    main()
