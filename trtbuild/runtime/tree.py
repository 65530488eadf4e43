"""Draft trees: expand the EAGLE-3 draft into candidate tokens and lay them out for verification.

The dynamic tree (EAGLE-2 style, TRT-LLM's `use_dynamic_tree`) expands, at each depth, the
`topk` best nodes so far by cumulative draft log-probability, each into its `topk` best children;
the `max_total_draft_tokens` best candidates overall form the tree the target verifies in one
forward. A chain is the same tree with topk = 1. All bookkeeping is tensor ops on tiny tensors;
their shapes depend only on (topk, depth), so there is no per-token Python work.

Layout handed to verification (index 0 is the root: the last emitted token, not yet in the
target's cache): tokens [N+1], depth [N+1], parent [N+1] (root: 0), ancestors [N+1, N+1]
(row i: i's ancestors and itself), nodes ordered so a parent comes before its children.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtbuild.runtime.draft import DraftModel
from trtbuild.runtime.kv_cache import KVCache

# Tie-breaker so a child never outranks its parent even when its log-prob rounds to 0.
DEPTH_PENALTY = 1e-4


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [N+1] target ids, root first
    depth: torch.Tensor  # [N+1]
    parent: torch.Tensor  # [N+1]
    ancestors: torch.Tensor  # [N+1, N+1] bool


@dataclass(frozen=True)
class TreeShape:
    depth: int  # draft steps = max_draft_len
    topk: int
    budget: int  # max_total_draft_tokens (tokens verified besides the root)

    @property
    def num_candidates(self) -> int:
        return self.topk + (self.depth - 1) * self.topk * self.topk

    @property
    def num_tokens(self) -> int:
        return min(self.budget, self.num_candidates)

    @property
    def draft_slots(self) -> int:
        """Draft-cache rows used past the committed prefix while drafting."""
        return (self.depth - 1) * self.topk


class TreeDrafter:
    """Builds a DraftTree per iteration for one (topk, depth, budget) shape."""

    def __init__(self, draft: DraftModel, shape: TreeShape) -> None:
        if shape.depth < 1 or shape.topk < 1 or shape.budget < 1:
            raise ValueError(f"bad tree shape {shape}")
        self.draft = draft
        self.shape = shape
        k, d = shape.topk, shape.depth
        dev = draft.target.device
        self.device = dev
        c = shape.num_candidates
        depth = [1] * k
        for level in range(2, d + 1):
            depth += [level] * (k * k)
        self.cand_depth = torch.tensor(depth, device=dev)
        # candidate blocks: [start, end) per level
        self.blocks = [(0, k)] + [(k + (lv - 2) * k * k, k + (lv - 1) * k * k) for lv in range(2, d + 1)]
        self.eye = torch.eye(c, dtype=torch.bool, device=dev)
        self.penalty = self.cand_depth.to(torch.float32) * DEPTH_PENALTY
        self.child_rank = torch.arange(k, device=dev)

    def build(self, out_last: torch.Tensor, logits_last: torch.Tensor, root: torch.Tensor,
              cache: KVCache, n: int) -> DraftTree:
        """out_last [1,1,h] and logits_last [1,1,dv]: the draft's step at the last real position.

        n: committed length (the root's position). Draft steps write cache rows n, n+k, ...
        """
        shape, draft = self.shape, self.draft
        k, dev = shape.topk, self.device
        c = shape.num_candidates
        logp = torch.log_softmax(logits_last[0, 0].float(), -1)
        scores, ids = logp.topk(k)
        cand_tokens = [draft.to_target[ids]]
        cand_scores = [scores]
        cand_parent = [torch.full((k,), -1, dtype=torch.long, device=dev)]
        # frontier: the nodes expanded at the next step
        f_idx = torch.arange(k, device=dev)  # candidate indices
        f_tokens, f_scores = cand_tokens[0], scores
        f_hidden = out_last.expand(1, k, out_last.shape[-1])
        slots = shape.draft_slots
        f_anc = torch.zeros(k, max(slots, 1), dtype=torch.bool, device=dev)
        prefix = torch.ones(k, n, dtype=torch.bool, device=dev)
        for level in range(1, shape.depth):
            start = n + (level - 1) * k
            f_anc[:, (level - 1) * k:level * k] |= self.eye[:k, :k]
            mask = torch.cat([prefix, f_anc[:, :level * k]], 1)
            positions = torch.full((k,), n + level - 1, dtype=torch.long, device=dev)
            out, logits = draft.forward(f_hidden, f_tokens.view(1, k), cache, start,
                                        positions=positions, mask=mask)
            logp = torch.log_softmax(logits[0].float(), -1)
            s, i = logp.topk(k, -1)  # [k, k]
            child_scores = (f_scores[:, None] + s).reshape(-1)
            child_tokens = draft.to_target[i.reshape(-1)]
            cand_tokens.append(child_tokens)
            cand_scores.append(child_scores)
            cand_parent.append(f_idx.repeat_interleave(k))
            if level < shape.depth - 1:
                sel = child_scores.topk(k).indices
                parent_row = sel // k
                f_idx = self.blocks[level][0] + sel
                f_tokens, f_scores = child_tokens[sel], child_scores[sel]
                f_hidden = out[:, parent_row]
                f_anc = f_anc[parent_row]
        tokens = torch.cat(cand_tokens)
        score = torch.cat(cand_scores)
        parent = torch.cat(cand_parent)
        # ancestors among candidates, level by level
        anc = self.eye.clone()
        for lo, hi in self.blocks[1:]:
            anc[lo:hi] |= anc[parent[lo:hi]]
        n_sel = shape.num_tokens
        if n_sel < c:
            sel = (score - self.penalty).topk(n_sel).indices.sort().values
        else:
            sel = torch.arange(c, device=dev)
        where = torch.full((c,), -1, dtype=torch.long, device=dev)
        where[sel] = torch.arange(1, n_sel + 1, device=dev)
        par = parent[sel]
        v_parent = torch.where(par < 0, torch.zeros_like(par), where[par.clamp(min=0)])
        v_anc = torch.ones(n_sel + 1, n_sel + 1, dtype=torch.bool, device=dev).tril()
        v_anc[1:, 1:] = anc[sel][:, sel]
        v_anc[0, 1:] = False
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        return DraftTree(
            tokens=torch.cat([root.view(1), tokens[sel]]),
            depth=torch.cat([zero, self.cand_depth[sel]]),
            parent=torch.cat([zero, v_parent]),
            ancestors=v_anc,
        )
