"""Kernels behind trtbuild's GEMM plugins (the registry is `trtbuild.core.plugins`).

gemm_weight_shuffle/   FP8 GEMM/GEMV reading tile-shuffled weights with contiguous wide loads
spatial_partition/     the warp-specialized (producer/consumer) version of that kernel
common/                arch table, weight layout, torch reference, split-K, AOT build + SASS checks

Subpackage `__init__` modules stay light (no torch/triton at import) so the registry can describe
plugins cheaply; kernel modules import triton at the top.
"""
