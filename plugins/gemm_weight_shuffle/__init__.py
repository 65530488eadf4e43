"""gemm_weight_shuffle: FP8 weights in tile-contiguous blocks + an FP8 GEMM/GEMV reading them.

Kernel: kernel.py (run through plugins.common.kernels). The registry entry
(`trtbuild.core.plugins.get("gemm_weight_shuffle")`) is plugins.common.fp8_plugin.PLUGINS. This
`__init__` imports nothing, so the package travels inside an engine bundle as it is.
"""
