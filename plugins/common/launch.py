"""Host side of the FP8 GEMM kernels: checks, launch geometry, split-K reduce."""

from __future__ import annotations

import torch

from .arch import ARCHS, arch_of_capability
from .jit import FP_FUSION, DualKernel, ensure_allocator
from .layout import cdiv
from .reference import check_operands
from .splitk import block_m_for, sm_count, split_k_for, splitk_reduce

_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


_ARCH_CONFIG: dict[int, tuple[int, int]] = {}


def _arch_config(device: torch.device) -> tuple[int, int]:
    """(num_warps, num_stages) for the device's arch; defaults off the table (and on CPU)."""
    if device.type != "cuda":
        return 4, 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _ARCH_CONFIG:  # once per device: this runs on every decode step
        arch = arch_of_capability(*torch.cuda.get_device_capability(index))
        _ARCH_CONFIG[index] = (ARCHS[arch].num_warps, ARCHS[arch].num_stages) if arch else (4, 4)
    return _ARCH_CONFIG[index]


def launch_fp8_gemm(kernel: DualKernel, x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor,
                    scale_w: torch.Tensor, n: int, k: int, out_dtype: torch.dtype | None = None, *,
                    out: torch.Tensor | None = None, split_k: int | None = None,
                    block_m: int | None = None, num_stages: int | None = None,
                    tma: bool = False, ctas_per_sm: int = 2) -> torch.Tensor:
    """y[..., N] = (x[..., K] @ W^T) * scale_x * scale_w with W shuffled [NT, KT, BN, BK].

    `out` (contiguous, [..., N]) is written in place when given (TensorRT plugins own their
    output buffers). `split_k` / `block_m` / `num_stages` override the heuristics (tests, tuning).
    `tma`: the kernel reads x through a TMA descriptor (rows must be 16-byte aligned).
    `ctas_per_sm`: how many of the kernel's CTAs one SM holds (split-K fills one wave of them).
    """
    check_operands(x, w, scale_x, scale_w, n, k)
    device = x.device
    if w.device != device or scale_x.device != device or scale_w.device != device:
        raise ValueError(f"all operands must be on {device}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if out is not None:
        if not out.is_contiguous() or out.numel() != m * n:
            raise ValueError(f"out must be contiguous with {m}x{n} elements")
        out_dtype = out.dtype
        y = out.view(m, n)
    else:
        out_dtype = out_dtype or torch.bfloat16
        y = torch.empty(m, n, dtype=out_dtype, device=device)
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    if m == 0:
        return y.view(*x.shape[:-1], n)
    if tma and (k % 16 or x2.stride(0) % 16 or x2.data_ptr() % 16):
        # TMA needs 16-byte aligned rows; only odd test shapes get here (real K are multiples of 16).
        kp = cdiv(k, 16) * 16
        padded = torch.zeros(m, kp, dtype=torch.uint8, device=device)
        padded[:, :k] = x2.view(torch.uint8)
        x2 = padded.view(x.dtype)
    if tma:
        if w.data_ptr() % 16 or not w.is_contiguous():
            raise ValueError("the shuffled weight must be contiguous and 16-byte aligned for TMA")
        ensure_allocator(device)

    nt, kt, bn, bk = w.shape
    bm = block_m or block_m_for(m)
    mt = cdiv(m, bm)
    if split_k is None:
        split, per_split = split_k_for(nt, mt, kt, sm_count(device) * ctas_per_sm)
    else:
        per_split = cdiv(kt, max(1, min(split_k, kt)))
        split = cdiv(kt, per_split)
    use_partials = split > 1
    partials = torch.empty(split, m, n, dtype=torch.float32, device=device) if use_partials else y
    num_warps, default_stages = _arch_config(device)

    kernel.for_device(device)[(nt * split, mt)](
        x2, w, scale_x, scale_w, y, partials,
        m, n, k, x2.stride(0), y.stride(0), kt, split, per_split,
        BLOCK_N=bn, BLOCK_K=bk, BLOCK_M=bm, NUM_STAGES=num_stages or default_stages,
        USE_PARTIALS=use_partials, num_warps=num_warps, enable_fp_fusion=FP_FUSION,
    )
    if use_partials:
        splitk_reduce(partials, scale_x, scale_w, y)
    return y.view(*x.shape[:-1], n)
