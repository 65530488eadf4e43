"""spatial_partition: the warp-specialized (TMA producer / MMA consumer) FP8 GEMM.

Same weight layout as gemm_weight_shuffle (the checkpoint is transformed once for both).
`PLUGIN` is what `trtbuild.plugins.get("spatial_partition")` returns. Kernel: kernel.py;
TensorRT-LLM Python plugin: trtllm_plugin.py (imports tensorrt_llm; load it only there).
"""

from plugins.common.fp8_plugin import Fp8ShuffledGemmPlugin

PLUGIN = Fp8ShuffledGemmPlugin(
    name="spatial_partition",
    description=("warp-specialized FP8 GEMM/GEMV on the tile-shuffled layout: Triton's "
                 "tl.range(warp_specialize=True) splits each CTA into a TMA producer warpgroup "
                 "filling a multi-stage shared-memory ring (mbarriers) and tensor-core consumer "
                 "warps (wgmma on sm_90a, tcgen05 on sm_100a)"),
    supported_archs=("sm_90a", "sm_100a"),
    kernel_module="plugins.spatial_partition.kernel",
    kernel_attr="fp8_gemm_ws_kernel",
    torch_op_name="trtbuild::fp8_gemm_ws",
    trtllm_plugin_name="TrtbuildFp8WarpSpecializedGemm",
    tma=True,
    warp_specialized=True,
    ctas_per_sm=1,  # the partitions claim the whole register file (setmaxnreg): 1 CTA per SM
)
