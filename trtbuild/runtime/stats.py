"""What one decoding run measured: speed, time to first token, draft acceptance."""

from __future__ import annotations

import time
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any


@dataclass
class DecodeStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    max_draft_len: int = 0  # 0 for plain decoding
    ttft_s: float = 0.0  # prompt in -> first new token out
    total_s: float = 0.0  # prompt in -> last new token out
    target_forwards: int = 0  # including the prefill
    target_s: float = 0.0  # wall time inside target forwards
    draft_s: float = 0.0  # wall time inside draft forwards and tree building
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per decode step
    off_chain: int = 0  # steps whose accepted path left the tree's first branch (K/V rows moved)

    def record(self, new: list[int], max_new: int, eos: Set[int], t0: float) -> tuple[list[int], bool]:
        """Cuts `new` at the first EOS / the token budget and counts it; returns (tokens, finished).
        One place for every decoding loop (single-stream and batched), so they stop alike."""
        room = max_new - self.new_tokens
        done = len(new) >= room
        new = new[:room]
        for j, tok in enumerate(new):
            if tok in eos:
                new, done = new[: j + 1], True
                break
        now = time.perf_counter()
        if self.new_tokens == 0:
            self.ttft_s = now - t0
        self.new_tokens += len(new)
        self.total_s = now - t0
        return new, done

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.ttft_s, 0.0)

    @property
    def tokens_per_s_per_user(self) -> float:
        """Decode speed after the first token: (new tokens - 1) / (time from first to last)."""
        if self.new_tokens < 2 or self.decode_s <= 0:
            return 0.0
        return (self.new_tokens - 1) / self.decode_s

    @property
    def acceptance_length(self) -> float:
        """tau: mean tokens emitted per decode-step target forward (1.0 for plain decoding)."""
        if not self.accepted:
            return 1.0
        return 1.0 + sum(self.accepted) / len(self.accepted)

    def acceptance_rates(self) -> list[float]:
        """Per draft position i (1-based): P(draft token i accepted | token i-1 accepted)."""
        return acceptance_rates(self.accepted, self.max_draft_len)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "tokens_per_s_per_user": self.tokens_per_s_per_user,
            "acceptance_length": self.acceptance_length,
            "target_forwards": self.target_forwards,
            "target_s": self.target_s,
            "draft_s": self.draft_s,
        }


def acceptance_rates(accepted: list[int], max_draft_len: int) -> list[float]:
    rates = []
    for i in range(1, max_draft_len + 1):
        reached = sum(1 for a in accepted if a >= i - 1)
        passed = sum(1 for a in accepted if a >= i)
        rates.append(passed / reached if reached else 0.0)
    return rates
