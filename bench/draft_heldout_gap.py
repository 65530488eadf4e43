"""Is a weak first draft position a train/decode mismatch or a draft that memorised its requests?

    python bench/draft_heldout_gap.py TARGET_HF_DIR DRAFT_DIR [TRAIN_JSONL EVAL_JSONL] [--prompts 8 --new 48]

For the training requests and for held-out ones (chat .jsonl, default tests/data/chat_train.jsonl and
chat_eval.jsonl), rendered as the served endpoint renders them, it measures in one run:
- teacher-forced first-step accuracy: the target greedily answers each request; the draft reads the
  target's own hidden states at every answer position in one forward (what training computes) and
  predicts the token after next; the share it gets right;
- decoding: tau at chain max_draft_len and the acceptance rate per position from the runtime's
  speculative decoding of the same requests (`measure_tau`, what the stage and `bench` report).
A mismatch between training and decoding shows as decode position-1 acceptance far below teacher-forced
accuracy on the *training* requests; memorisation shows as both being high there and both low held out.
Acceptance per position is conditional (position k counts only steps that accepted k-1), so after a
weak first position the later ones are measured on the easy stretches only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def teacher_forced_first_step(target, draft, generator, prompts: list[list[int]], new: int) -> float:  # type: ignore[no-untyped-def]
    hits = total = 0
    with torch.inference_mode():
        for prompt in prompts:
            answer = generator.generate(prompt, new, eos_token_ids=[]).tokens
            seq = torch.tensor([*prompt, *answer]).view(1, -1)
            _, aux = target.forward(seq, target.new_cache(1, seq.shape[1] + 2), 0, aux_layers=draft.aux_layers)
            following = torch.cat([seq[0, 1:], seq.new_zeros(1)]).view(1, -1)
            _, logits = draft.forward(draft.project(aux), following, draft.new_cache(1, seq.shape[1] + 2), 0)
            guess = draft.to_target[logits[0].argmax(-1)]  # at position i: the token at i + 2
            for i in range(len(prompt) - 1, seq.shape[1] - 2):
                hits += int(guess[i] == seq[0, i + 2])
                total += 1
    return hits / total


def main() -> None:
    from trtbuild.draft.evaluate import measure_tau
    from trtbuild.runtime import Generator, load_draft, load_target
    from trtbuild.runtime.bench import load_prompts

    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("train", nargs="?", type=Path, default=DATA / "chat_train.jsonl")
    parser.add_argument("eval", nargs="?", type=Path, default=DATA / "chat_eval.jsonl")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--draft-len", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_target(args.target)
    draft = load_draft(args.draft, target)
    generator = Generator(target)
    for split, path in (("training requests", args.train), ("held-out requests", args.eval)):
        prompts = [list(p) for p in load_prompts(str(path.resolve()), args.target, args.prompts, 1)]
        decoded = measure_tau(args.target, args.draft, prompts, args.new, args.draft_len)
        print(json.dumps({"requests": split, "file": str(path), "prompts": len(prompts), "new_tokens": args.new,
                          "teacher_forced_first_step": round(
                              teacher_forced_first_step(target, draft, generator, prompts, args.new), 3),
                          "decode_tau": decoded["acceptance_length"],
                          "decode_acceptance_by_position": decoded["acceptance_rates"]}))


if __name__ == "__main__":
    main()
