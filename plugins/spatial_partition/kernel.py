"""Warp-specialized ("spatial partitioning") FP8 GEMM over tile-shuffled weights.

Same function, layout and launch geometry as plugins/gemm_weight_shuffle, but the K loop is
`tl.range(..., warp_specialize=True)` over TMA descriptor loads, which Triton 3.9 splits into
partitions of one CTA: a producer warpgroup issuing TMA copies into a NUM_STAGES-deep
shared-memory ring guarded by mbarriers, and consumer warps doing the tensor-core math
(sm_90a: two consumer warpgroups, each a 64-row wgmma half of the 128-row tile;
sm_100a: a single-warp tcgen05 MMA issuer plus the producer and an epilogue partition).

The descriptors are built on the device (`tl.make_tensor_descriptor`): on sm_90a that lets
Triton split the 128-row weight box between the two consumers; with a host descriptor it
cannot and the build fails. They need 256 bytes of global scratch per program from
`triton.set_allocator` (installed by the launcher when none is set).
A shuffled weight viewed as 2-D [NT*KT*BN, BK] makes tile (n, k) the TMA box at row
(n*KT + k)*BN: one contiguous 16 KB copy per stage. x is read as [M, K] with TMA zero fill,
which needs K*1 byte rows 16-byte aligned (the launcher pads x when K % 16 != 0).
"""

from __future__ import annotations

import triton.language as tl

from ..common.jit import dual_jit
from ..common.signature import FP8_GEMM_AOT_ALIGNED, FP8_GEMM_AOT_SIGNATURE


def _fp8_gemm_ws_kernel(
    x_ptr, w_ptr, sx_ptr, sw_ptr, out_ptr, part_ptr,
    M, N, K, stride_xm, stride_om, KT, SPLIT, TILES_PER_SPLIT,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
    NUM_STAGES: tl.constexpr, USE_PARTIALS: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = pid % SPLIT
    pid_n = pid // SPLIT
    kt0 = pid_s * TILES_PER_SPLIT
    kt1 = tl.minimum(kt0 + TILES_PER_SPLIT, KT)
    NT = (N + BLOCK_N - 1) // BLOCK_N

    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[NT * KT * BLOCK_N, BLOCK_K], strides=[BLOCK_K, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    row0 = pid_n * KT * BLOCK_N

    acc = tl.full((BLOCK_N, BLOCK_M), 0.0, dtype=tl.float32)  # not tl.zeros: see common/jit.py
    for kt in tl.range(kt0, kt1, num_stages=NUM_STAGES, warp_specialize=True):
        w = w_desc.load([row0 + kt * BLOCK_N, 0])
        x = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])  # rows >= M, cols >= K read as 0
        acc = tl.dot(w, x.T, acc)

    offs_n = tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + offs_n
    mask = (rn[:, None] < N) & (offs_m[None, :] < M)
    if USE_PARTIALS:
        p_ptrs = part_ptr + pid_s * M * N + offs_m[None, :] * N + rn[:, None]
        tl.store(p_ptrs, acc, mask=mask)
    else:
        acc = acc * (tl.load(sx_ptr) * tl.load(sw_ptr))
        o_ptrs = out_ptr + offs_m[None, :] * stride_om + rn[:, None]
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


fp8_gemm_ws_kernel = dual_jit(_fp8_gemm_ws_kernel)

AOT_SIGNATURE = FP8_GEMM_AOT_SIGNATURE
AOT_ALIGNED = FP8_GEMM_AOT_ALIGNED
