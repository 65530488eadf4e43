"""How fast the target writes the draft's training answers on this CPU: float32 vs bfloat16, by batch size,
side by side in one run (issue 34: the answers phase is the long run's largest cost).

    python bench/draft_generation.py TARGET_HF_DIR [--batches 32,64,128] [--tokens 64] [--rows 128]

Each setting continues the same chat requests (tests/data/chat_train.jsonl, rendered as the served
endpoint renders them) greedily with the draft stage's own `greedy_fill`, after one warm-up call.
Prints generated tokens per second per setting, each ratio to float32 at the same batch size, and how
often the bfloat16 continuation equals float32's token for token (greedy decoding in two precisions
diverges once two logits tie within rounding). One JSON object.
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
    args = parser.parse_args()
    torch.set_num_threads(2)
    prompts = chat_prompts(args.target, args.rows)
    seq_len = max(len(p) for p in prompts) + args.tokens
    results: dict[str, dict[str, float]] = {}
    outputs: dict[str, torch.Tensor] = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_target(args.target, dtype=dtype)
        greedy_fill(model, prompts[:4], min(len(p) for p in prompts[:4]) + 4)  # warm-up
        for batch in (int(b) for b in args.batches.split(",")):
            name = f"{str(dtype).removeprefix('torch.')} batch {batch}"
            start, rows = time.perf_counter(), []
            for first in range(0, len(prompts), batch):
                rows.append(greedy_fill(model, prompts[first:first + batch], seq_len))
            seconds = time.perf_counter() - start
            outputs[name] = torch.cat(rows)
            generated = sum(seq_len - len(p) for p in prompts)
            results[name] = {"seconds": round(seconds, 2), "tokens_per_s": round(generated / seconds, 1)}
            print(name, results[name], flush=True)
    for name, row in results.items():
        if name.startswith("bfloat16"):
            twin = name.replace("bfloat16", "float32")
            row["speedup_vs_float32"] = round(results[twin]["seconds"] / row["seconds"], 2)
            row["rows_equal_to_float32"] = round(float((outputs[name] == outputs[twin]).all(1).float().mean()), 3)
    print(json.dumps({"target": str(args.target), "rows": args.rows, "new_tokens": args.tokens,
                      "settings": results}, indent=1))


if __name__ == "__main__":
    main()
