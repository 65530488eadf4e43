"""gemm_weight_shuffle: FP8 weights in tile-contiguous blocks + an FP8 GEMM/GEMV reading them.

`PLUGIN` is what `trtbuild.plugins.get("gemm_weight_shuffle")` returns. Kernel: kernel.py;
TensorRT-LLM Python plugin: trtllm_plugin.py (imports tensorrt_llm; load it only there).
"""

from plugins.common.fp8_plugin import Fp8ShuffledGemmPlugin

PLUGIN = Fp8ShuffledGemmPlugin(
    name="gemm_weight_shuffle",
    description=("FP8 (e4m3) linear weights shuffled offline into tile-contiguous BLOCK_N x BLOCK_K "
                 "blocks (tiles per arch); an FP8 GEMM/GEMV with per-tensor scales streams each "
                 "program's tiles with contiguous 16-byte loads through a cp.async ring"),
    supported_archs=("sm_89", "sm_90a", "sm_100a", "sm_120a"),
    kernel_module="plugins.gemm_weight_shuffle.kernel",
    kernel_attr="fp8_gemm_shuffled_kernel",
    torch_op_name="trtbuild::fp8_gemm_shuffled",
    trtllm_plugin_name="TrtbuildFp8ShuffledGemm",
    tma=False,
    warp_specialized=False,
    ctas_per_sm=2,  # about 73 KB of shared memory and 42 registers per CTA: 2-3 fit per SM
)
