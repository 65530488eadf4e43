"""The draft trained on the target's chat answers alone vs with plain text added, on the same pool, in one run.

    python bench/draft_text_mix.py TARGET_HF_DIR DATA_ENTRY OUT_DIR --text-rows 1800 [field=value ...]

ModelOpt's EAGLE-3 loss is the target's own next-token distribution at every position
(`HFEagleModel._eagle_loss`: softmax of the base model's logits), so any text teaches the draft the
target's behaviour; text needs only a hidden-state dump (a forward), where a chat answer needs the
target to write it (about 1.4 s an answer on 2 cores against 0.2 s a dumped row). This measures
whether cheap text lifts held-out chat acceptance where more answers are dear.

DATA_ENTRY: a draft-data cache entry of chat answers (e.g. `bench/real_checkpoint_report.py`'s,
`<cache>/draft-data/<key>`). The added rows are BOS-led windows of the pydoc training split, as the
stage cuts text windows. Both drafts train through the draft stage's own code (`train_draft`: settings
are bench/smollm2-report.yaml's draft section plus the overrides; offline hidden states, dumped into
the cache of TRTBUILD_CACHE). The draft vocabulary is calibrated on the chat rows in both, so the
text cannot take vocabulary slots from the answers. Both are measured on the same held-out chat
prompts with the stage's `measure_tau`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from draft_training import draft_config, eval_prompt_file, train

RECIPE = Path(__file__).resolve().parent / "smollm2-report.yaml"


def text_rows(target: Path, count: int, seq_len: int, seed: int) -> torch.Tensor:
    from transformers import AutoTokenizer

    from trtbuild.core.data import sources

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    source = sources.TextSource(kind="pydoc")
    texts = sources.load_texts(source, "train", tokenizer=tokenizer)
    return sources.token_windows(tokenizer, texts, count, seq_len, seed, bos=True,
                                 separator=sources.joiner(source))


def write_entry(directory: Path, pool: torch.Tensor, shard_rows: int) -> None:
    """A draft-data entry as the stage writes one: `input_ids` shards and the set's meta."""
    from trtbuild.draft import shards

    directory.mkdir(parents=True)
    count = shards.shard_count(pool.shape[0], shard_rows)
    for index in range(count):
        shards.write_shard(directory, index, {"input_ids": pool[index * shard_rows:(index + 1) * shard_rows]})
    (directory / shards.SET_META).write_text(json.dumps(
        {"kind": "draft-data", "rows": int(pool.shape[0]), "seq_len": int(pool.shape[1]),
         "shard_samples": shard_rows, "shards": count}))


def main() -> None:
    from trtbuild.draft import draft_data, vocab
    from trtbuild.draft.evaluate import measure_tau
    from trtbuild.draft.shards import ShardSet
    from trtbuild.runtime.bench import load_prompts

    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("entry", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--text-rows", type=int, default=1800)
    parser.add_argument("--skip-chat-only", action="store_true", help="train only the mixed draft")
    parser.add_argument("--text-seed", type=int, default=0,
                        help="seed of the text windows (the training seed is the `seed=` override): another "
                        "training seed reuses the pools' hidden-state dumps")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    config, overrides = draft_config(RECIPE, args.overrides)
    torch.set_num_threads(2)
    chat = draft_data.load_pool(args.entry)
    pools = {"chat answers only": chat}
    if args.text_rows:
        text = text_rows(args.target, args.text_rows, chat.shape[1], args.text_seed)
        pools[f"chat answers + {args.text_rows} pydoc rows"] = torch.cat([chat, text])
    if args.skip_chat_only:
        pools.pop("chat answers only")
    calibrate = vocab.calibrate_d2t
    chat_tokens = chat.flatten().tolist()
    prompts = load_prompts(eval_prompt_file(config), args.target, config.eval.prompts, 1, base_dir=RECIPE.parent)
    depth, new_tokens = config.max_draft_len, config.eval.new_tokens
    result: dict[str, Any] = {"overrides": overrides, "chat_rows": int(chat.shape[0]), "training_seed": config.seed,
                              "drafts": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, pool) in enumerate(pools.items()):
            entry = Path(scratch) / f"pool-{index}"
            write_entry(entry, pool, config.shard_samples)
            # keyed by what makes the pool (entry, rows, text seed), not the training seed: a rerun
            # with another seed finds the pool's hidden-state dump again
            key = f"bench-mix-{args.entry.name}-{len(pool)}-{args.text_seed}"
            found = ShardSet(entry, key, reused=True, computed=0, kept=0, seconds=0.0)
            with mock.patch.object(draft_data, "ensure_data", lambda *a, f=found, **k: f), \
                 mock.patch.object(vocab, "calibrate_d2t", lambda tokens, *a: calibrate(chat_tokens, *a)):
                started = time.perf_counter()
                trained = train(config, args.target, args.out / f"draft-{index}", RECIPE.parent)
                seconds = time.perf_counter() - started
            started = time.perf_counter()
            tau = measure_tau(args.target, args.out / f"draft-{index}" / "eagle3", prompts, new_tokens, depth,
                              max_matching_ngram_size=2)
            m = trained["metrics"]
            result["drafts"][name] = {
                "pool_rows": int(pool.shape[0]), "stage_seconds": round(seconds, 1),
                "train_seconds": m["train_seconds"], "train_step_accuracy": m["train_step_accuracy"],
                "vocab_coverage": m["vocab_coverage"], "tau": round(tau["acceptance_length"], 3),
                "acceptance_by_position": tau["acceptance_rates"],
                "eval_seconds": round(time.perf_counter() - started, 1)}
            print(json.dumps({name: result["drafts"][name]}), flush=True)
    result["eval"] = f"{len(prompts)} held-out chat prompts x {new_tokens} tokens, chain {depth}"
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
