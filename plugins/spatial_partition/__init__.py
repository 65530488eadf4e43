"""spatial_partition: the warp-specialized (TMA producer / MMA consumer) FP8 GEMM.

Same weight layout as gemm_weight_shuffle. Kernel: kernel.py (run through plugins.common.kernels).
The registry entry is plugins.common.fp8_plugin.PLUGINS. This `__init__` imports nothing, so the
package travels inside an engine bundle as it is.
"""
