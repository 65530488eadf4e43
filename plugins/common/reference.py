"""Pure-torch FP8 GEMM on the shuffled layout: the function every kernel must match.

y[m, n] = sum_k x[m, k] * W[n, k] * scale_x * scale_w, computed in float32 from the fp8 values
(products of two e4m3 numbers are exact in float32), then cast to the output dtype.
"""

from __future__ import annotations

import torch

from plugins.common.layout import FP8, unshuffle

FP8_MAX = 448.0  # largest finite e4m3fn


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to e4m3 with saturation (ModelOpt's static per-tensor input quantization).

    Done in torch on purpose: the Triton interpreter misrounds fp32->fp8 inside kernels.
    """
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def check_operands(x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
                   n: int, k: int) -> None:
    """Raise ValueError with the first thing wrong with these operands."""
    if x.dtype != FP8 or w.dtype != FP8:
        raise ValueError(f"x and w must be float8_e4m3fn, got {x.dtype} and {w.dtype}")
    if n <= 0 or k <= 0:
        raise ValueError(f"empty weight: n={n}, k={k}")
    if w.dim() != 4:
        raise ValueError(f"w must be the shuffled [NT, KT, BN, BK] weight, got shape {tuple(w.shape)}")
    nt, kt, bn, bk = w.shape
    if not (nt * bn >= n > (nt - 1) * bn and kt * bk >= k > (kt - 1) * bk):
        raise ValueError(f"shuffled weight {tuple(w.shape)} does not hold an [{n}, {k}] matrix")
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {k}")
    if scale_x.numel() != 1 or scale_w.numel() != 1:
        raise ValueError("scale_x and scale_w must be per-tensor (one value each)")


def fp8_gemm_reference(x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
                       n: int, k: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] fp8, w [NT, KT, BN, BK] fp8 (shuffled) -> [..., N] in out_dtype (bf16 default)."""
    check_operands(x, w, scale_x, scale_w, n, k)
    dense = unshuffle(w, n, k).float()
    y = x.reshape(-1, k).float() @ dense.t()
    y = y * (scale_x.float().reshape(()) * scale_w.float().reshape(()))
    return y.to(out_dtype or torch.bfloat16).reshape(*x.shape[:-1], n)
