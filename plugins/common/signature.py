"""The argument list every FP8 GEMM plugin kernel shares, as the AOT build types it.

Both kernels take the same arguments in the same order (plugins.common.launch passes them), so
they compile against one signature: pointers and leading strides 16-byte aligned, as the JIT
specializes them for real model shapes (K, N multiples of 16).
"""

FP8_GEMM_AOT_SIGNATURE = {
    "x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "sx_ptr": "*fp32", "sw_ptr": "*fp32",
    "out_ptr": "*bf16", "part_ptr": "*fp32",
    "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_om": "i32",
    "KT": "i32", "SPLIT": "i32", "TILES_PER_SPLIT": "i32",
}
FP8_GEMM_AOT_ALIGNED = ("x_ptr", "w_ptr", "sx_ptr", "sw_ptr", "out_ptr", "part_ptr", "N", "K",
                        "stride_xm", "stride_om")
