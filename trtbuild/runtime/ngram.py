"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the current suffix earlier on.

No draft model: the last `max_matching_ngram_size` tokens of the context (prompt + everything
emitted) are looked up among the earlier n-grams of the same context, longest first, and the
tokens that followed the match are proposed (up to `max_draft_len`). This is what TensorRT-LLM's
`NGram` speculative decoding does with a private pool per request (`is_public_pool: false`),
and what transformers calls prompt-lookup decoding. Which earlier occurrence is used when an
n-gram occurred several times: the oldest (TRT-LLM's default `is_use_oldest: true`) or the most
recent one.

The index is updated incrementally, a few dict operations per emitted token, so a proposal costs
microseconds next to a target forward.
"""

from __future__ import annotations

from collections.abc import Iterable


class NGramDrafter:
    """The n-gram index of one request's context."""

    def __init__(self, max_matching_ngram_size: int, max_draft_len: int, use_oldest: bool = True) -> None:
        if max_matching_ngram_size < 1 or max_draft_len < 1:
            raise ValueError("max_matching_ngram_size and max_draft_len must be at least 1")
        self.max_ngram = max_matching_ngram_size
        self.max_draft_len = max_draft_len
        self.use_oldest = use_oldest
        self.tokens: list[int] = []
        # per n: n-gram -> index of the token that followed it (the start of its continuation)
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_matching_ngram_size + 1)]

    def extend(self, tokens: Iterable[int]) -> None:
        """Appends tokens to the context; every n-gram they complete becomes a lookup key."""
        ctx = self.tokens
        for token in tokens:
            ctx.append(int(token))
            follower = len(ctx) - 1  # the n-grams ending just before it now have a continuation
            for n in range(1, min(self.max_ngram, follower) + 1):
                key = tuple(ctx[follower - n:follower])
                table = self._index[n]
                if not self.use_oldest or key not in table:
                    table[key] = follower

    def propose(self, limit: int | None = None) -> list[int]:
        """Draft tokens for the next step (possibly none): the continuation of the longest match."""
        ctx = self.tokens
        count = self.max_draft_len if limit is None else min(limit, self.max_draft_len)
        for n in range(min(self.max_ngram, len(ctx)), 0, -1):
            start = self._index[n].get(tuple(ctx[len(ctx) - n:]))
            if start is not None:
                return ctx[start:start + count]
        return []
