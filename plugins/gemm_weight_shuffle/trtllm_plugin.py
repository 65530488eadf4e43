"""TensorRT-LLM Python plugin (legacy `backend: tensorrt` engines) for gemm_weight_shuffle.

Importing this module registers the plugin with TensorRT-LLM; it imports tensorrt_llm, so load it
only where TensorRT-LLM is installed, and import it again before deserializing an engine that
uses it. Inputs: x [..., K] fp8, the shuffled weight [NT, KT, BN, BK] fp8, scale_x [1] and
scale_w [1] float32; output [..., N] in `out_dtype`. `forward` launches the Triton kernel on
TensorRT's stream (PluginBase.enqueue makes it torch's current stream).
"""

# No `from __future__ import annotations` here: trtllm_plugin() reads the return annotation of
# shape_dtype_inference at class creation and must see the SymTensor class, not a string.
from collections.abc import Sequence

import torch
from tensorrt_llm import PluginBase
from tensorrt_llm._utils import TensorWrapper, convert_to_torch_tensor  # defined there in every 1.x
from tensorrt_llm.python_plugin import SymTensor, trtllm_plugin

from plugins.common.launch import launch_fp8_gemm
from plugins.gemm_weight_shuffle.kernel import fp8_gemm_shuffled_kernel


@trtllm_plugin("TrtbuildFp8ShuffledGemm")
class TrtbuildFp8ShuffledGemm(PluginBase):
    def __init__(self, n: int, k: int, out_dtype: str = "bfloat16") -> None:
        super().__init__()
        self.n = n
        self.k = k
        self.out_dtype = out_dtype

    def shape_dtype_inference(self, inputs: Sequence[SymTensor]) -> SymTensor:
        shape = inputs[0].shape  # dims are unknown (None) while TensorRT asks for dtypes only
        if len(shape):
            shape[len(shape) - 1] = self.n
        return SymTensor(getattr(torch, self.out_dtype), shape)

    def forward(self, inputs: Sequence[TensorWrapper], outputs: Sequence[TensorWrapper]) -> None:
        x, w, scale_x, scale_w = (convert_to_torch_tensor(t) for t in inputs)
        out = convert_to_torch_tensor(outputs[0])
        launch_fp8_gemm(fp8_gemm_shuffled_kernel, x, w, scale_x, scale_w, self.n, self.k, out=out)
