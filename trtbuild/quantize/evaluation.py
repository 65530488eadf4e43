"""Perplexity and logit comparison, computed one way for every model the project evaluates.

A model is given as a `LogitsFn` (input_ids [B, T] -> logits [B, T, V]) so a Hugging Face model,
a ModelOpt fake-quantized one and the project's own runtime are all measured by the same code:
the quantize gate compares two perplexities and they must not differ in how they are counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtbuild.core.progress import Progress

if TYPE_CHECKING:
    import torch

LogitsFn = Callable[["torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class Perplexity:
    value: float  # exp(mean next-token negative log-likelihood)
    nll: float  # mean negative log-likelihood in nats per token
    tokens: int  # predicted tokens counted (windows x (seq_len - 1))


def hf_logits(model: Any) -> LogitsFn:
    """Logits of a transformers causal LM, without a KV cache, on the model's device."""
    device = next(model.parameters()).device

    def logits(input_ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids.to(device), use_cache=False).logits

    return logits


def perplexity(logits_fn: LogitsFn, windows: torch.Tensor, *, batch_size: int = 8,
               progress: Progress | None = None, description: str = "perplexity") -> Perplexity:
    """Perplexity over token windows [N, T]: every window scored independently, all T-1 targets.

    Log-probabilities are taken in float32 whatever the model's dtype, and summed (not averaged
    per batch) so the result does not depend on batch_size.
    """
    import torch
    import torch.nn.functional as F

    progress = progress or Progress()
    total_nll = 0.0
    count = 0
    batches = range(0, windows.shape[0], batch_size)
    with torch.no_grad(), progress.task(description, total=len(batches)) as bar:
        for start in batches:
            batch = windows[start: start + batch_size]
            logits = logits_fn(batch).float()
            targets = batch[:, 1:].to(logits.device)
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                  reduction="sum")
            total_nll += nll.item()
            count += targets.numel()
            bar.advance(1, ppl=math.exp(total_nll / count))
    mean = total_nll / count
    return Perplexity(value=math.exp(mean), nll=mean, tokens=count)


@dataclass(frozen=True)
class LogitsAgreement:
    max_abs_diff: float
    max_abs_logit: float  # scale of the reference logits, to read max_abs_diff against
    mean_cosine: float  # mean over positions of cos(logits_a, logits_b)
    min_cosine: float
    argmax_agreement: float  # fraction of positions whose top-1 token is the same
    positions: int

    def as_metrics(self, prefix: str) -> dict[str, float | int]:
        return {f"{prefix}_{k}": v for k, v in self.__dict__.items()}


def compare_logits(reference: torch.Tensor, other: torch.Tensor) -> LogitsAgreement:
    """How closely two [B, T, V] logit tensors agree, position by position."""
    import torch.nn.functional as F

    a = reference.float().reshape(-1, reference.shape[-1])
    b = other.float().to(a.device).reshape(-1, other.shape[-1])
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {tuple(reference.shape)} vs {tuple(other.shape)}")
    cosine = F.cosine_similarity(a, b, dim=-1)
    return LogitsAgreement(
        max_abs_diff=(a - b).abs().max().item(),
        max_abs_logit=a.abs().max().item(),
        mean_cosine=cosine.mean().item(),
        min_cosine=cosine.min().item(),
        argmax_agreement=(a.argmax(-1) == b.argmax(-1)).float().mean().item(),
        positions=a.shape[0],
    )
