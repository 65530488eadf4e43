"""Stand-in for Llama4MinLatencyLinear (tensorrt_llm/_torch/models/modeling_llama_min_latency.py@025b36c3;
not TensorRT-LLM): apply_linear quantizes the input, then runs TensorRT-LLM's own min-latency kernels for
the fused qkv (in 5120, out 896) up to 8 tokens, for FC2 (out 5120, in a multiple of 512) and the fused
gate_up + SwiGLU up to 16 tokens, and only above that the parent's apply_linear (quant_method.apply).
The kernels are stood in by one counted float GEMM."""
from __future__ import annotations

import torch

from ..modules.linear import Linear

CALLS = {"own_kernel": 0}


class Llama4MinLatencyLinear(Linear):

    def __init__(self, *args, enable_fused_gemm_swiglu: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.enable_fused_gemm_swiglu = enable_fused_gemm_swiglu

    def _own_kernel(self, input):
        CALLS["own_kernel"] += 1
        scale = self.input_scale * self.weight_scale
        return ((input.float() @ self.weight.float().t()) * scale).to(self.dtype)

    def apply_linear(self, input, bias, lora_params=None, layer_idx=None):
        if input.dtype != torch.float8_e4m3fn:
            input, _ = torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor(input, self.input_scale)
        tokens = input.shape[0]
        if tokens <= 8 and self.in_features == 5120 and self.out_features == 896:
            return self._own_kernel(input)
        if tokens <= 16 and self.in_features % 512 == 0 and self.out_features == 5120:
            return self._own_kernel(input)
        if self.enable_fused_gemm_swiglu and tokens <= 16:
            return self._own_kernel(input)
        return super().apply_linear(input, bias, lora_params, layer_idx)
