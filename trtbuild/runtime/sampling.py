"""Token selection from logits: greedy (argmax) or sampled with temperature / top-k / top-p."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


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
