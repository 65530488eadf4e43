"""Pure-torch FP8 GEMM on the shuffled layout: the function every kernel must match, and the CPU
implementation of the plugins' torch ops.

y[m, n] = sum_k x[m, k] * W[n, k] * scale_x * scale_w, computed in float32 from the fp8 values
(products of two e4m3 numbers are exact in float32), then cast to the output dtype; in float64 when
float64 output is asked for (trtbuild's CPU runtime: its speculative decoding must match plain
decoding exactly, which float32 summation-order noise can break).
"""

from __future__ import annotations

import weakref

import torch

from .layout import FP8, unshuffle

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


# id(weight) -> (weakref to it, version, dtype, W^T dense): unshuffling and converting a weight costs
# far more than a decode-sized product with it, so the reference does it once per weight.
_DENSE: dict[int, tuple[weakref.ref, tuple[int, int], torch.dtype, torch.Tensor]] = {}


def _version(w: torch.Tensor) -> tuple[int, int]:
    try:
        return w._version, w.data_ptr()
    except RuntimeError:  # inference tensors keep no version counter
        return -1, w.data_ptr()


def dense_t(w: torch.Tensor, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """W^T [K, N] in `dtype` from the shuffled weight, cached while that tensor lives unchanged."""
    key = id(w)
    entry = _DENSE.get(key)
    version = _version(w)
    if entry is not None and entry[0]() is w and entry[1] == version and entry[2] == dtype:
        return entry[3]
    dense = unshuffle(w, n, k).to(dtype).t().contiguous()
    if entry is None or entry[0]() is not w:
        weakref.finalize(w, _DENSE.pop, key, None)
    _DENSE[key] = (weakref.ref(w), version, dtype, dense)
    return dense


def fp8_gemm_reference(x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
                       n: int, k: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] fp8, w [NT, KT, BN, BK] fp8 (shuffled) -> [..., N] in out_dtype (bf16 default)."""
    check_operands(x, w, scale_x, scale_w, n, k)
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    y = x.reshape(-1, k).to(acc) @ dense_t(w, n, k, acc)
    y = y * (scale_x.to(acc).reshape(()) * scale_w.to(acc).reshape(()))
    return y.to(out_dtype or torch.bfloat16).reshape(*x.shape[:-1], n)
