"""EAGLE-3 chain drafting for every sequence of a batch at once (a `Speculator`).

Per sequence it keeps what the single-stream loop (`Decoding._speculative`) keeps: a draft KV
cache (one slot of a `BatchKV`, rows aligned with the target's positions), the draft's output
at the last committed position and its logits there. Each step drafts `max_draft_len` tokens
for all its sequences in lockstep (one draft forward per depth, one row per sequence), and after
verification runs the draft over each sequence's newly committed positions with the target's
real hidden states, batched and padded. What it proposes can only change speed, never output.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from trtbuild.runtime.batch_forward import Layout, draft_rows
from trtbuild.runtime.batch_kv import BatchKV
from trtbuild.runtime.draft import DraftModel
from trtbuild.runtime.speculator import SequenceState


class Eagle3ChainSpeculator:
    def __init__(self, draft: DraftModel, max_draft_len: int, slots: int, min_draft_prob: float = 0.0) -> None:
        if max_draft_len < 1:
            raise ValueError("max_draft_len must be at least 1")
        self.draft = draft
        self.depth = max_draft_len
        self.min_draft_prob = min_draft_prob
        self.aux_layers = draft.aux_layers
        spec, device = draft.spec, draft.target.device
        self.max_positions = draft.target.max_positions
        self.kv = BatchKV(len(draft.layers), slots, spec.num_kv_heads, spec.head_dim, draft.dtype, device)
        self.order: list[SequenceState] = []  # slot i holds order[i]
        self.hidden = torch.zeros(slots, 1, spec.hidden_size, dtype=draft.dtype, device=device)
        self.logits = torch.zeros(slots, draft.draft_vocab, dtype=draft.dtype, device=device)

    # -- Speculator ------------------------------------------------------------------------

    def admit(self, seqs: Seq[SequenceState], aux: torch.Tensor | None) -> None:
        """The draft over each prompt: row j pairs the target's hidden state at j with token j+1
        (the last one is the first generated token), as the single-stream prefill does."""
        assert aux is not None
        lo, hi, width = len(self.order), len(self.order) + len(seqs), aux.shape[1]
        ids = torch.zeros(len(seqs), width, dtype=torch.long, device=aux.device)
        for i, seq in enumerate(seqs):
            ids[i, : seq.prompt_len] = torch.tensor(seq.tokens[1: seq.prompt_len + 1])
        lengths = torch.tensor([seq.prompt_len for seq in seqs], device=aux.device)
        self.kv.ensure(width)
        layout = Layout.causal(torch.zeros_like(lengths), width, self.max_positions)
        out, logits = draft_rows(self.draft, self.draft.project(aux), ids, self.kv.view(lo, hi), layout,
                                 last=lengths - 1)
        self.hidden[lo:hi] = out
        self.logits[lo:hi] = logits[:, 0]
        self.order.extend(seqs)

    def propose(self, seqs: Seq[SequenceState], limit: int | None = None) -> list[list[int]]:
        b = len(self.order)
        depth = self.depth if limit is None else min(self.depth, limit)
        if b == 0 or depth < 1:
            return [[] for _ in seqs]
        draft = self.draft
        starts = torch.tensor([seq.length for seq in self.order], device=self.hidden.device)
        self.kv.ensure(int(starts.max()) + depth)
        tok = draft.to_target[self.logits[:b].argmax(-1)]
        chain, hidden = [tok], self.hidden[:b]
        keep = torch.full((b,), depth, dtype=torch.long)  # drafted tokens kept per sequence
        for k in range(1, depth):
            layout = Layout.causal(starts + k - 1, 1, self.max_positions)
            hidden, logits = draft_rows(draft, hidden, tok.view(b, 1), self.kv.view(0, b), layout)
            step = logits[:, -1]
            if self.min_draft_prob > 0:
                # chain drafting stops where the draft is unsure (the first token is always proposed)
                unsure = (step.softmax(-1).amax(-1) < self.min_draft_prob).cpu()
                keep = torch.where(unsure & (keep == depth), torch.full_like(keep, k), keep)
            tok = draft.to_target[step.argmax(-1)]
            chain.append(tok)
        tokens = torch.stack(chain, 1).tolist()
        by_id = {seq.id: row[: int(n)] for seq, row, n in zip(self.order, tokens, keep, strict=True)}
        return [by_id[seq.id] for seq in seqs]

    def update(self, seqs: Seq[SequenceState], accepted: Seq[int], aux: torch.Tensor | None) -> None:
        """The draft's real entries for the newly committed positions, and its next first guess."""
        assert aux is not None
        if not seqs:
            return
        where = {seq.id: i for i, seq in enumerate(seqs)}
        index = [where[seq.id] for seq in self.order]  # slot order
        taken = torch.tensor([accepted[i] for i in index], device=aux.device)
        width = int(taken.max()) + 1
        ids = torch.zeros(len(index), width, dtype=torch.long, device=aux.device)
        for row, seq in enumerate(self.order):
            n = int(taken[row]) + 1
            ids[row, :n] = torch.tensor(seq.tokens[-n:])
        starts = torch.tensor([seq.length for seq in self.order], device=aux.device) - taken - 1
        self.kv.ensure(int((starts + width).max()))
        layout = Layout.causal(starts, width, self.max_positions)
        rows = aux[torch.tensor(index, device=aux.device), :width]
        out, logits = draft_rows(self.draft, self.draft.project(rows), ids, self.kv.view(0, len(index)),
                                 layout, last=taken)
        self.hidden[: len(index)] = out
        self.logits[: len(index)] = logits[:, 0]

    def release(self, seq: SequenceState) -> None:
        slot = next(i for i, s in enumerate(self.order) if s.id == seq.id)
        last = len(self.order) - 1
        if slot != last:
            moved = self.order[last]
            self.kv.move(last, slot, moved.length)
            self.hidden[slot] = self.hidden[last]
            self.logits[slot] = self.logits[last]
            self.order[slot] = moved
        self.order.pop()
