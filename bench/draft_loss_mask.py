"""The draft trained everywhere vs on the target's answers only, on the same pool, in one run.

    python bench/draft_loss_mask.py TARGET_HF_DIR DATA_ENTRY OUT_DIR [field=value ...]

DATA_ENTRY: a draft-data cache entry made for TARGET_HF_DIR from chat requests (e.g. by
`bench/real_checkpoint_report.py`: `<cache>/draft-data/<key>`). Each row's request is found as the
rendered prompt up to its first `<|im_start|>assistant\\n` (single-turn chats), and
trtbuild.draft.data.answer_loss_mask gives the answer-only mask from it. Both drafts train through the
draft stage's own code (`train_draft`: the same pool, hidden states, settings and seed; fields are
DraftConfig's on top of bench/smollm2-report.yaml's draft section; the mask handed to
`trtbuild.draft.train.train`) and are measured on the same held-out chat prompts with the stage's
`measure_tau`, with n-gram prompt lookup beside them. Prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from draft_training import draft_config, eval_prompt_file, train

RECIPE = Path(__file__).resolve().parent / "smollm2-report.yaml"


def answer_mask(pool: torch.Tensor, tokenizer: Any) -> torch.Tensor:
    from trtbuild.draft.data import answer_loss_mask

    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    answer_starts = []
    for row in pool.tolist():
        starts = [i for i in range(len(row) - len(header)) if row[i:i + len(header)] == header]
        if not starts:
            raise SystemExit("a pool row without an assistant turn: not a chat pool")
        answer_starts.append(starts[0] + len(header))
    return answer_loss_mask(pool, answer_starts, [tokenizer.eos_token_id])


def main(argv: list[str]) -> None:
    from transformers import AutoTokenizer

    from trtbuild.draft import draft_data
    from trtbuild.draft import train as training
    from trtbuild.draft.evaluate import measure_tau
    from trtbuild.draft.shards import ShardSet
    from trtbuild.runtime.bench import load_prompts

    target, entry, out = Path(argv[0]), Path(argv[1]), Path(argv[2])
    config, overrides = draft_config(RECIPE, argv[3:])
    torch.set_num_threads(2)
    pool = draft_data.load_pool(entry)
    masks = {"everywhere (the stage's default)": torch.ones_like(pool, dtype=torch.uint8),
             "answer only": answer_mask(pool, AutoTokenizer.from_pretrained(str(target)))}
    train_with_mask = training.train
    found = ShardSet(entry, entry.name, reused=True, computed=0, kept=0, seconds=0.0)
    result: dict[str, Any] = {"overrides": overrides, "pool_rows": int(pool.shape[0]), "drafts": {}}
    prompts = load_prompts(eval_prompt_file(config), target, config.eval.prompts, 1, base_dir=RECIPE.parent)
    depth, new_tokens = config.max_draft_len, config.eval.new_tokens
    for index, (name, mask) in enumerate(masks.items()):
        def masked(*args: Any, m: torch.Tensor = mask, **kwargs: Any) -> Any:
            return train_with_mask(*args, **kwargs, loss_mask=m)

        with mock.patch.object(draft_data, "ensure_data", lambda *a, **k: found), \
             mock.patch.object(training, "train", masked):
            trained = train(config, target, out / f"draft-{index}", RECIPE.parent)
        started = time.perf_counter()
        tau = measure_tau(target, out / f"draft-{index}" / "eagle3", prompts, new_tokens, depth,
                          max_matching_ngram_size=2)
        m = trained["metrics"]
        result["drafts"][name] = {
            "trained_tokens": int(mask.sum()), "train_seconds": m["train_seconds"],
            "train_step_accuracy": m["train_step_accuracy"], "vocab_coverage": m["vocab_coverage"],
            "tau": round(tau["acceptance_length"], 3), "acceptance_by_position": tau["acceptance_rates"],
            "eval_seconds": round(time.perf_counter() - started, 1)}
    ngram = measure_tau(target, None, prompts, new_tokens, depth, max_matching_ngram_size=2)
    result["ngram"] = {"tau": round(ngram["acceptance_length"], 3), "acceptance_by_position": ngram["acceptance_rates"]}
    result["eval"] = f"{len(prompts)} held-out chat prompts x {new_tokens} tokens, chain {depth}"
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
