"""Launch geometry shared by the FP8 GEMM kernels: token tile, split-K, and the split-K reduce.

Decode GEMMs have few row blocks (N / 128 = 32 for a 4096-wide layer) next to 132+ SMs, so the
K dimension is split across programs until one wave of CTAs fills the GPU; each program streams
its own contiguous run of weight tiles. Partial sums (fp32) go to a [SPLIT, M, N] buffer and one
small kernel adds them in a fixed order (deterministic, no atomics), applies the scales, casts.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .jit import FP_FUSION, dual_jit
from .layout import cdiv

BLOCK_M_CHOICES = (16, 32, 64)  # token tile = the MMA's N side (tl.dot needs >= 16)
MIN_TILES_PER_SPLIT = 2  # keep a few K steps per program so the load ring has work to overlap


def block_m_for(m: int) -> int:
    for bm in BLOCK_M_CHOICES:
        if m <= bm:
            return bm
    return BLOCK_M_CHOICES[-1]


def split_k_for(n_tiles: int, m_tiles: int, k_tiles: int, slots: int) -> tuple[int, int]:
    """(split, k_tiles_per_split): as many programs as fit in one wave of `slots` CTAs (SMs x CTAs
    per SM), never more (a second, partial wave would idle most SMs); every split non-empty."""
    programs = n_tiles * m_tiles
    split = max(1, min(slots // programs, k_tiles // MIN_TILES_PER_SPLIT))
    per_split = cdiv(k_tiles, split)
    return cdiv(k_tiles, per_split), per_split


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few programs, enough to exercise split-K
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _splitk_reduce_kernel(part_ptr, sx_ptr, sw_ptr, out_ptr, MN, SPLIT, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.full((BLOCK,), 0.0, dtype=tl.float32)
    for s in range(0, SPLIT):
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    scale = tl.load(sx_ptr) * tl.load(sw_ptr)
    tl.store(out_ptr + offs, (acc * scale).to(out_ptr.dtype.element_ty), mask=mask)


splitk_reduce_kernel = dual_jit(_splitk_reduce_kernel)
REDUCE_BLOCK = 1024


def splitk_reduce(partials: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
                  out: torch.Tensor) -> None:
    """out[m, n] = sum_s partials[s, m, n] * scale_x * scale_w (out contiguous [M, N])."""
    split = partials.shape[0]
    mn = out.numel()
    grid = (cdiv(mn, REDUCE_BLOCK),)
    splitk_reduce_kernel.for_device(out.device)[grid](
        partials, scale_x, scale_w, out, mn, split, BLOCK=REDUCE_BLOCK, num_warps=4,
        enable_fp_fusion=FP_FUSION)
