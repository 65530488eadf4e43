"""Decoding loops: plain (one target forward per token), EAGLE-3 speculative (tree/chain) and
prompt-lookup (n-gram) speculative decoding.

All are iterators of newly emitted token ids, so a server can stream them; `Generator.generate`
drains one and returns the tokens with `DecodeStats`. Speculative verification walks the draft
tree with the token the target itself picks at each node (argmax, or a draw from its sampling
distribution), so greedy output equals plain greedy decoding and sampled output follows the
target's own distribution exactly, whatever the draft proposes. A chain (EAGLE-3 chain drafting,
n-gram proposals) is verified by the same causal forward as a plain prefill of those tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from trtbuild.core.errors import UserError
from trtbuild.runtime.draft import DraftModel
from trtbuild.runtime.kv_cache import KVCache
from trtbuild.runtime.ngram import NGramDrafter
from trtbuild.runtime.sampling import Sampler, SamplingParams
from trtbuild.runtime.stats import DecodeStats
from trtbuild.runtime.target import TargetModel
from trtbuild.runtime.tree import TreeDrafter, TreeShape


@dataclass(frozen=True)
class SpecParams:
    """How to draft. method `eagle3` (needs the draft model): `chain` drafts max_draft_len tokens in
    a line, `tree` a dynamic top-k tree. method `ngram`: prompt lookup, no draft model, a chain of
    at most max_draft_len tokens that followed the longest matching n-gram earlier in the context."""

    max_draft_len: int = 4
    mode: Literal["chain", "tree"] = "chain"
    topk: int = 4
    max_total_draft_tokens: int = 16
    # chain only: stop drafting once the draft's own probability of its token falls below this
    # (verifying a token costs target compute on a CPU; unlikely ones are not worth it). 0 = off.
    min_draft_prob: float = 0.0
    method: Literal["eagle3", "ngram"] = "eagle3"
    max_matching_ngram_size: int = 3  # ngram: longest suffix looked up
    ngram_use_oldest: bool = True  # ngram: the earliest occurrence of a match (TRT-LLM's default)

    def shape(self) -> TreeShape:
        if self.mode == "chain" or self.method == "ngram":
            return TreeShape(self.max_draft_len, 1, self.max_draft_len)
        return TreeShape(self.max_draft_len, self.topk, self.max_total_draft_tokens)


@dataclass
class Generation:
    tokens: list[int]
    stats: DecodeStats


@dataclass
class _Clock:
    """Splits wall time into target forwards, draft forwards and everything else."""

    target_s: float = 0.0
    draft_s: float = 0.0
    marks: list[float] = field(default_factory=list)


class Decoding:
    """One request being decoded; iterate it for lists of new token ids."""

    def __init__(self, generator: Generator, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int,
                 sampling: SamplingParams, spec: SpecParams | None, eos_token_ids: Sequence[int] | None,
                 ) -> None:
        target = generator.target
        ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise UserError("empty prompt")
        if max_new_tokens < 1:
            raise UserError("max_new_tokens must be at least 1")
        extra = spec.shape().num_tokens + 2 if spec else 1
        if ids.numel() + max_new_tokens + extra > target.max_positions:
            raise UserError(f"prompt ({ids.numel()}) + max_new_tokens ({max_new_tokens}) exceed the "
                            f"model's {target.max_positions} positions")
        if spec is not None and spec.method == "eagle3" and generator.draft is None:
            raise UserError("EAGLE-3 speculative decoding needs a draft model")
        self.gen = generator
        self.prompt = ids.to(target.device).view(1, -1)
        self.max_new = max_new_tokens
        self.sampler = Sampler(sampling, target.device)
        self.spec = spec
        self.eos = set(target.spec.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.stats = DecodeStats(prompt_tokens=ids.numel(), max_draft_len=spec.max_draft_len if spec else 0)
        if spec is None:
            self._iter = self._plain()
        else:
            self._iter = self._ngram() if spec.method == "ngram" else self._speculative()

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        return next(self._iter)

    # -- helpers ------------------------------------------------------------------------

    def _emit(self, new: list[int], t0: float) -> tuple[list[int], bool]:
        """Cuts `new` at EOS / the token budget, records it; returns (tokens, finished)."""
        return self.stats.record(new, self.max_new, self.eos, t0)

    # -- plain decoding -------------------------------------------------------------------

    def _plain(self) -> Iterator[list[int]]:
        target, stats = self.gen.target, self.stats
        with torch.inference_mode():
            t0 = time.perf_counter()
            n = self.prompt.shape[1]
            cache = target.new_cache(1, n + self.max_new + 1)
            logits, _ = target.forward(self.prompt, cache, 0, logits_rows=slice(-1, None))
            tok = self.sampler(logits[0])
            stats.target_forwards += 1
            stats.target_s = time.perf_counter() - t0
            while True:
                new, done = self._emit([int(tok)], t0)
                yield new
                if done:
                    return
                t1 = time.perf_counter()
                logits, _ = target.forward(tok.view(1, 1), cache, n)
                tok = self.sampler(logits[0])
                n += 1
                stats.target_forwards += 1
                stats.target_s += time.perf_counter() - t1
                stats.accepted.append(0)

    # -- speculative decoding -------------------------------------------------------------

    def _speculative(self) -> Iterator[list[int]]:
        target, draft, stats = self.gen.target, self.gen.draft, self.stats
        assert draft is not None and self.spec is not None
        drafter = self.gen.drafter(self.spec)
        shape = drafter.shape
        with torch.inference_mode():
            t0 = time.perf_counter()
            n = self.prompt.shape[1]
            tcache = target.new_cache(1, n + self.max_new + shape.num_tokens + 2)
            dcache = draft.new_cache(1, n + self.max_new + shape.draft_slots + 2)
            logits, aux = target.forward(self.prompt, tcache, 0, aux_layers=draft.aux_layers,
                                         logits_rows=slice(-1, None))
            root = self.sampler(logits[0])[0]
            t1 = time.perf_counter()
            stats.target_forwards += 1
            stats.target_s += t1 - t0
            next_ids = torch.cat([self.prompt[0, 1:], root.view(1)]).view(1, -1)
            out_last, dlogits = draft.forward(draft.project(aux), next_ids, dcache, 0,
                                              logits_rows=slice(-1, None))
            stats.draft_s += time.perf_counter() - t1
            new, done = self._emit([int(root)], t0)
            yield new
            while not done:
                t1 = time.perf_counter()
                if shape.topk == 1:
                    tokens, draft_s, logits, aux = self._draft_chain(out_last, dlogits, root, tcache, dcache,
                                                                     n, shape.depth, self.spec.min_draft_prob)
                    picked = self.sampler(logits[0])  # the target's token after each position
                    a = int((tokens[1:] == picked[:-1]).cumprod(0).sum())
                    path = None
                    root = picked[a]
                    emitted = torch.cat([tokens[1:a + 1], root.view(1)])
                    real_aux = aux[:, : a + 1]
                else:
                    tree = drafter.build(out_last, dlogits, root, dcache, n)
                    draft_s = time.perf_counter() - t1
                    size = tree.tokens.shape[0]
                    mask = torch.cat([torch.ones(size, n, dtype=torch.bool, device=target.device),
                                      tree.ancestors], 1)
                    logits, aux = target.forward(tree.tokens.view(1, -1), tcache, n, positions=n + tree.depth,
                                                 mask=mask, aux_layers=draft.aux_layers)
                    picked = self.sampler(logits[0])  # the target's token after each node
                    ok = tree.tokens == picked[tree.parent]
                    ok[0] = True
                    accepted = ~(tree.ancestors & ~ok).any(1)
                    best = int(torch.where(accepted, tree.depth, -1).argmax())
                    path = tree.ancestors[best].nonzero().view(-1)
                    a = path.shape[0] - 1
                    if int(path[-1]) != a:  # the accepted branch is not stored contiguously
                        tcache.keep(n, path)
                        stats.off_chain += 1
                    root = picked[best]
                    emitted = torch.cat([tree.tokens[path[1:]], root.view(1)])
                    real_aux = aux[:, path]
                t3 = time.perf_counter()
                # the draft's real entries for the accepted positions (and its next first guess)
                out_last, dlogits = draft.forward(draft.project(real_aux), emitted.view(1, -1), dcache, n,
                                                  logits_rows=slice(-1, None))
                t4 = time.perf_counter()
                n += a + 1
                stats.target_forwards += 1
                stats.accepted.append(a)
                stats.draft_s += draft_s + (t4 - t3)
                stats.target_s += t3 - t1 - draft_s
                new, done = self._emit(emitted.tolist(), t0)
                yield new

    # -- prompt-lookup (n-gram) speculative decoding ----------------------------------------

    def _ngram(self) -> Iterator[list[int]]:
        target, stats, spec = self.gen.target, self.stats, self.spec
        assert spec is not None
        drafter = NGramDrafter(spec.max_matching_ngram_size, spec.max_draft_len, spec.ngram_use_oldest)
        drafter.extend(self.prompt[0].tolist())
        with torch.inference_mode():
            t0 = time.perf_counter()
            n = self.prompt.shape[1]
            cache = target.new_cache(1, n + self.max_new + spec.max_draft_len + 2)
            logits, _ = target.forward(self.prompt, cache, 0, logits_rows=slice(-1, None))
            root = int(self.sampler(logits[0])[0])
            stats.target_forwards += 1
            stats.target_s = time.perf_counter() - t0
            new, done = self._emit([root], t0)
            yield new
            while not done:
                t1 = time.perf_counter()
                drafter.extend(new)
                # never propose past the token budget (TRT-LLM stops at max_seq_len the same way)
                proposal = drafter.propose(self.max_new - stats.new_tokens - 1)
                chain = torch.tensor([root, *proposal], dtype=torch.long, device=target.device)
                t2 = time.perf_counter()
                logits, _ = target.forward(chain.view(1, -1), cache, n)
                picked = self.sampler(logits[0]).tolist()  # the target's token after each position
                a = 0
                while a < len(proposal) and proposal[a] == picked[a]:
                    a += 1
                root = picked[a]
                t3 = time.perf_counter()
                n += a + 1
                stats.target_forwards += 1
                stats.accepted.append(a)
                stats.draft_s += t2 - t1
                stats.target_s += t3 - t2
                new, done = self._emit([*proposal[:a], root], t0)
                yield new

    def _draft_chain(self, out_last: torch.Tensor, dlogits: torch.Tensor, root: torch.Tensor,
                     tcache: KVCache, dcache: KVCache, n: int, depth: int, min_prob: float
                     ) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor]:
        """Chain drafting: greedy draft tokens at positions n+1.., verified causally in one forward.

        Rows and positions are contiguous, so no tree mask, no position gather, no K/V moves.
        Returns (tokens [depth+1] with the root first, draft seconds, target logits, aux).
        """
        target, draft = self.gen.target, self.gen.draft
        assert draft is not None
        t1 = time.perf_counter()
        tokens = [root.view(1)]
        tok, hidden, step_logits = root, out_last[:, -1:], dlogits[0, -1]
        for k in range(depth):
            if k:
                hidden, out = draft.forward(hidden, tok.view(1, 1), dcache, n + k - 1)
                step_logits = out[0, -1]
            if min_prob > 0 and k and float(step_logits.softmax(-1).max()) < min_prob:
                break  # the first draft token is always proposed
            tok = draft.to_target[step_logits.argmax()]
            tokens.append(tok.view(1))
        chain = torch.cat(tokens)
        t2 = time.perf_counter()
        logits, aux = target.forward(chain.view(1, -1), tcache, n, aux_layers=draft.aux_layers)
        assert aux is not None
        return chain, t2 - t1, logits, aux


class Generator:
    """Decodes with a target model and, for speculative decoding, an EAGLE-3 draft."""

    def __init__(self, target: TargetModel, draft: DraftModel | None = None) -> None:
        self.target = target
        self.draft = draft
        self._drafters: dict[TreeShape, TreeDrafter] = {}

    def drafter(self, spec: SpecParams) -> TreeDrafter:
        shape = spec.shape()
        if shape not in self._drafters:
            assert self.draft is not None
            self._drafters[shape] = TreeDrafter(self.draft, shape)
        return self._drafters[shape]

    def stream(self, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
               sampling: SamplingParams | None = None, spec: SpecParams | None = None,
               eos_token_ids: Sequence[int] | None = None) -> Decoding:
        """An iterator of lists of new token ids (its `.stats` fill in as it runs)."""
        return Decoding(self, prompt, max_new_tokens, sampling or SamplingParams(), spec, eos_token_ids)

    def generate(self, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
                 sampling: SamplingParams | None = None, spec: SpecParams | None = None,
                 eos_token_ids: Sequence[int] | None = None) -> Generation:
        run = self.stream(prompt, max_new_tokens, sampling=sampling, spec=spec, eos_token_ids=eos_token_ids)
        tokens = [tok for chunk in run for tok in chunk]
        return Generation(tokens, run.stats)
