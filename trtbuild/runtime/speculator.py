"""What the in-flight batch decoder (`trtbuild.runtime.batch`) asks of a speculator.

A speculator proposes draft tokens for the sequences assigned to it and keeps whatever state
it needs per sequence (EAGLE-3: a draft KV cache row range and its last hidden state; an n-gram
/ prompt-lookup speculator: nothing but the token history it can read from the sequence). The
decoder verifies all proposals of a step in one batched target forward and reports back what
was accepted. Proposals only cost speed: output is the target's own choice at every position.

Call order per sequence: `admit` once after its prompt went through the target, then per decode
step `propose` -> (verification) -> `update`, and `release` when it leaves the batch (finished,
cancelled) — `release` may come at any step boundary. Each call gets every live sequence of
this speculator at once, so implementations can batch their own work.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import torch


class SequenceState(Protocol):
    """What a speculator may read of a sequence (trtbuild.runtime.batch.Sequence)."""

    id: int
    tokens: list[int]  # prompt + emitted; the last one (the root) is not yet in the target's cache
    length: int  # target cache rows committed: len(tokens) - 1
    prompt_len: int


class Speculator(Protocol):
    # Target decoder layers whose outputs the speculator reads (EAGLE-3's aux hidden states);
    # () when it needs none. The decoder returns them from the prefill and every verification.
    aux_layers: tuple[int, ...]

    def admit(self, seqs: Seq[SequenceState], aux: torch.Tensor | None) -> None:
        """New sequences, prefilled: aux [len(seqs), P, A] holds row i's prompt positions
        [0, seqs[i].prompt_len) (later rows are padding); seqs[i].tokens[-1] is its first token."""

    def propose(self, seqs: Seq[SequenceState], limit: int | None = None) -> list[list[int]]:
        """Draft tokens (target vocabulary ids, a chain following tokens[-1]) per sequence, at most
        `limit` each (None: the speculator's own length); may be empty."""

    def update(self, seqs: Seq[SequenceState], accepted: Seq[int], aux: torch.Tensor | None) -> None:
        """After verification: seqs[i] accepted accepted[i] of its drafts and committed them plus the
        root, so its tokens gained accepted[i] + 1 entries and its length grew by as much; aux
        [len(seqs), R, A] holds, in rows [0, accepted[i] + 1), the target's hidden states at those
        newly committed positions."""

    def release(self, seq: SequenceState) -> None:
        """The sequence left the batch; forget it."""
