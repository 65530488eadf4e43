"""The LM head of a float64 model, computed in float32 with float64 values where the argmax is decided.

A float64 model (the FP8 target on CPU) computes in float64 so that a 1-token decode and a
multi-token verification pick the same tokens. Its LM head is the largest GEMM of a small model
(SmolLM2: 49 152 x 576, 226 MB in float64, streamed once per decode step), and only the logits
near each row's maximum can change a greedy choice. So the head runs in float32 (half the bytes)
and every logit within twice the float32 error bound of its row's maximum is recomputed in float64.

The bound (standard error analysis, any summation order): rounding h to float32 and summing K
products in float32 is off by at most (K + 2) u sum_k |h_k w_k| <= (K + 2) u |h| |w_n|, u = 2^-24.
A logit that could beat the float32 winner in float64 lies within two bounds of the float32
maximum, so it is a candidate and gets its float64 value; every other logit stays below the
winner's float64 value. The argmax is therefore the float64 argmax, for any row count.
"""

from __future__ import annotations

import torch

from trtbuild.runtime.layers import gemm_by_rows

UNIT_ROUNDOFF = 2.0 ** -24
SAFETY = 4.0  # on top of the bound: covers the weight's own rounding to float32 and the float64 sums


class RefinedHead:
    """logits = h @ W^T: float32 everywhere, float64 for every logit that can be a row's argmax."""

    __slots__ = ("weight64", "weight_t", "weight_rows", "error_per_norm")

    def __init__(self, weight: torch.Tensor) -> None:
        """weight [V, H] in float64 (kept by reference: a tied head shares the embedding table)."""
        self.weight64 = weight
        # both layouts: a one-row decode streams [H, V], a few-row verification [V, H] (gemm_by_rows)
        self.weight_rows = weight.to(torch.float32).contiguous()
        self.weight_t = self.weight_rows.t().contiguous()
        k = weight.shape[1]
        largest_row = float(weight.norm(dim=1).max())
        self.error_per_norm = SAFETY * (k + 2) * UNIT_ROUNDOFF * largest_row

    @property
    def weight(self) -> torch.Tensor:
        return self.weight64

    @property
    def out_features(self) -> int:
        return self.weight64.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits32 = gemm_by_rows(flat.to(torch.float32), self.weight_t, self.weight_rows)
        top = logits32.max(-1, keepdim=True).values
        bound = flat.norm(dim=-1, keepdim=True) * self.error_per_norm  # float64
        rows, cols = (logits32 >= top - 2 * bound).nonzero(as_tuple=True)
        logits = logits32.to(torch.float64)
        logits[rows, cols] = (flat[rows] * self.weight64[cols]).sum(-1)
        return logits.view(*x.shape[:-1], logits.shape[-1]).to(x.dtype)
