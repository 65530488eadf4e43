"""Token selection from logits: greedy (argmax) or sampled with temperature / top-k / top-p.

A temperature below TEMPERATURE_EPSILON decodes greedily (as vLLM's _SAMPLING_EPS = 1e-5 does):
dividing logits by 1e-40 overflows to inf and the softmax to NaN, while the distribution at such a
temperature is the argmax anyway. Parameters are range-checked where they are made, integers
before any cast (a 2^32 + 1 top_k must not become 1 in a C int).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trtbuild.core.errors import UserError

TEMPERATURE_EPSILON = 1e-5
MAX_TOP_K = 2**31 - 1
SEED_RANGE = 2**64  # torch.Generator.manual_seed takes a 64-bit unsigned seed


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # below TEMPERATURE_EPSILON: greedy
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t, k, p, seed = self.temperature, self.top_k, self.top_p, self.seed
        if isinstance(t, bool) or not isinstance(t, int | float) or not (math.isfinite(t) and t >= 0.0):
            raise UserError(f"must be a finite number >= 0, got {t!r}", field="temperature")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_K:
            raise UserError(f"must be a whole number in [0, {MAX_TOP_K}], got {_short(k)}", field="top_k")
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
            raise UserError(f"must be in (0, 1], got {p!r}", field="top_p")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_RANGE):
            raise UserError(f"must be a whole number in [0, 2^64), got {_short(seed)}", field="seed")

    @property
    def greedy(self) -> bool:
        return self.temperature < TEMPERATURE_EPSILON or self.top_k == 1


def _short(value: object) -> str:
    if isinstance(value, int) and abs(value) >= 10**40:  # str() refuses over 4300 digits
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


class Sampler:
    """Picks one token per row of logits [R, V]; rows are independent draws."""

    def __init__(self, params: SamplingParams, device: torch.device | str = "cpu") -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.params.greedy:
            return logits.argmax(-1)
        return torch.multinomial(self.probs(logits), 1, generator=self.generator).squeeze(-1)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution tokens are drawn from (after temperature, top-k and top-p)."""
        p = self.params
        logits = logits.float() / p.temperature
        if p.top_k > 0 and p.top_k < logits.shape[-1]:
            kth = logits.topk(p.top_k, -1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(-1, descending=True)
            # drop a token once the mass before it already reaches top_p (keeps at least one)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs
