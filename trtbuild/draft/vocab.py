"""Draft-vocabulary calibration: keep the target tokens the training data uses most.

The draft predicts over `draft_vocab_size` tokens; `d2t[i]` is the offset from draft id `i` to its
target id (target_id = i + d2t[i]), the table TRT-LLM and ModelOpt read. Like ModelOpt's
`calibrate_frequent_vocab` we rank by frequency; unlike it we (a) list the chosen ids in ascending
target-id order, so d2t is non-negative and monotone, and (b) fill up with the lowest unused ids
when the data has fewer distinct tokens than asked for, instead of failing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from trtbuild.core.errors import UserError


def most_frequent_tokens(token_ids: Iterable[int], target_vocab_size: int,
                         draft_vocab_size: int) -> list[int]:
    """The `draft_vocab_size` most frequent ids (ties: lower id first), ascending."""
    if not 0 < draft_vocab_size <= target_vocab_size:
        raise UserError(f"draft_vocab_size {draft_vocab_size} must be in 1..target vocab_size "
                        f"{target_vocab_size}", field="draft.draft_vocab_size")
    counts = Counter(int(t) for t in token_ids)
    out_of_range = [t for t in counts if not 0 <= t < target_vocab_size]
    if out_of_range:
        raise UserError(f"token id {out_of_range[0]} from the training data is outside the target vocab "
                        f"(vocab_size {target_vocab_size})", field="draft.dataset")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    chosen = {token for token, _ in ranked[:draft_vocab_size]}
    filler = (t for t in range(target_vocab_size) if t not in chosen)
    while len(chosen) < draft_vocab_size:
        chosen.add(next(filler))
    return sorted(chosen)


def d2t_table(chosen_ids: list[int]) -> Any:
    """int64 tensor [draft_vocab]: d2t[i] = chosen_ids[i] - i."""
    import torch

    ids = torch.tensor(chosen_ids, dtype=torch.int64)
    return ids - torch.arange(len(chosen_ids), dtype=torch.int64)


def calibrate_d2t(token_ids: Iterable[int], target_vocab_size: int,
                  draft_vocab_size: int) -> tuple[Any, float]:
    """(d2t, coverage): the table and the share of training tokens the draft vocab covers."""
    tokens = [int(t) for t in token_ids]
    chosen = most_frequent_tokens(tokens, target_vocab_size, draft_vocab_size)
    keep = set(chosen)
    coverage = sum(1 for t in tokens if t in keep) / max(len(tokens), 1)
    return d2t_table(chosen), coverage
