"""A draft trained by the draft stage's own code on a chat target, measured on held-out chat prompts.

    python bench/draft_chat.py TARGET_HF_DIR OUT_DIR [field=value ...]

TARGET_HF_DIR: the unquantized target (e.g. the SmolLM2-135M-Instruct fixture of
tests/real_checkpoint.py). Fields are DraftConfig's (`steps=150 lr=3e-3 samples=40`), on top of the
draft section of tests/data/smollm2-chat.yaml (the CI recipe; its data paths resolve there).
The held-out prompts are the section's `eval` (tests/data/chat_eval.jsonl; override e.g.
`eval={dataset: chat_eval.jsonl, prompts: 8, new_tokens: 64}`), rendered with the target's chat
template as the served endpoint renders them. Prints one JSON line: data / dump (offline) /
training / evaluation seconds, training's per-step accuracy, and tau at chain 3 for the draft (with
acceptance per position) and for n-gram prompt lookup, measured on the same prompts in the same run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from draft_training import draft_config, eval_prompt_file, train

RECIPE = Path(__file__).resolve().parent.parent / "tests" / "data" / "smollm2-chat.yaml"


def main(argv: list[str]) -> None:
    import torch

    from trtbuild.draft.evaluate import measure_tau
    from trtbuild.runtime.bench import load_prompts

    target, out = Path(argv[0]), Path(argv[1])
    config, overrides = draft_config(RECIPE, argv[2:])
    torch.set_num_threads(2)
    result = train(config, target, out, RECIPE.parent)
    metrics = result["metrics"]
    row: dict[str, Any] = {"overrides": overrides, "data_seconds": metrics["data_seconds"],
                           "train_seconds": metrics["train_seconds"], "train_steps": metrics["train_steps"],
                           "dump_seconds": metrics.get("dump_seconds"),  # hidden_states: offline only
                           "pool_sequences": metrics["pool_sequences"],
                           "train_step_accuracy": metrics["train_step_accuracy"]}
    prompts = load_prompts(eval_prompt_file(config), target, config.eval.prompts, 1, base_dir=RECIPE.parent)
    depth, new_tokens = config.max_draft_len, config.eval.new_tokens
    started = time.perf_counter()
    for draft_dir, tag in ((out / "eagle3", "e"), (None, "n")):  # None: n-gram prompt lookup
        tau = measure_tau(target, draft_dir, prompts, new_tokens, depth, max_matching_ngram_size=2)
        row[f"{tag}tau{depth}"] = round(tau["acceptance_length"], 3)
        row[f"{tag}rates{depth}"] = [round(r, 3) for r in tau["acceptance_rates"]]
    row["eval_seconds"] = round(time.perf_counter() - started, 1)
    row["eval"] = f"{len(prompts)} held-out chat prompts x {new_tokens} tokens, chain {depth}"
    print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1:])
