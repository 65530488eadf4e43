"""FP8 GEMM/GEMV over tile-shuffled weights: y = (x_fp8 @ W^T) * scale_x * scale_w.

Each program owns one BLOCK_N row block of W, one run of K tiles (split-K) and one token tile.
It computes acc[BLOCK_N, BLOCK_M] += W_tile @ x_tile^T ("swap AB": weight rows fill the MMA's
M side, so 1..16 decode tokens cost one 16-wide MMA N side instead of a padded 64-row M side).
The weight tiles a program reads are one contiguous byte range (see plugins/common/layout.py):
unmasked 16-byte cp.async loads into a NUM_STAGES-deep shared-memory ring, then wgmma
(sm_90a) / tcgen05 (sm_100a) / mma.sync (sm_89, sm_120a) on e4m3 operands.
"""

from __future__ import annotations

import triton.language as tl

from ..common.jit import dual_jit
from ..common.signature import FP8_GEMM_AOT_ALIGNED, FP8_GEMM_AOT_SIGNATURE


def _fp8_gemm_shuffled_kernel(
    x_ptr, w_ptr, sx_ptr, sw_ptr, out_ptr, part_ptr,
    M, N, K, stride_xm, stride_om, KT, SPLIT, TILES_PER_SPLIT,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
    NUM_STAGES: tl.constexpr, USE_PARTIALS: tl.constexpr,
):
    # Split index fastest: consecutive programs stream consecutive byte ranges of the weight.
    pid = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = pid % SPLIT
    pid_n = pid // SPLIT
    kt0 = pid_s * TILES_PER_SPLIT
    kt1 = tl.minimum(kt0 + TILES_PER_SPLIT, KT)

    TILE: tl.constexpr = BLOCK_N * BLOCK_K
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    w_ptrs = (w_ptr + (pid_n * KT + kt0).to(tl.int64) * TILE
              + offs_n[:, None] * BLOCK_K + offs_k[None, :])
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + kt0 * BLOCK_K + offs_k[None, :]
    m_ok = offs_m[:, None] < M

    acc = tl.full((BLOCK_N, BLOCK_M), 0.0, dtype=tl.float32)  # not tl.zeros: see common/jit.py
    for kt in tl.range(kt0, kt1, num_stages=NUM_STAGES):
        w = tl.load(w_ptrs)  # padded layout: never out of bounds
        x = tl.load(x_ptrs, mask=m_ok & ((kt * BLOCK_K + offs_k)[None, :] < K), other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
        w_ptrs += TILE
        x_ptrs += BLOCK_K

    rn = pid_n * BLOCK_N + offs_n
    mask = (rn[:, None] < N) & (offs_m[None, :] < M)
    if USE_PARTIALS:
        p_ptrs = part_ptr + pid_s * M * N + offs_m[None, :] * N + rn[:, None]
        tl.store(p_ptrs, acc, mask=mask)
    else:
        acc = acc * (tl.load(sx_ptr) * tl.load(sw_ptr))
        o_ptrs = out_ptr + offs_m[None, :] * stride_om + rn[:, None]
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


fp8_gemm_shuffled_kernel = dual_jit(_fp8_gemm_shuffled_kernel)

AOT_SIGNATURE = FP8_GEMM_AOT_SIGNATURE
AOT_ALIGNED = FP8_GEMM_AOT_ALIGNED
