"""Stand-in for tensorrt_llm/_torch/modules/linear.py of TensorRT-LLM 1.2.1 (not TensorRT-LLM).

Minimal and faithful to the recorded facts (trtbuild/core/contract/trtllm-1.2.1.yaml, fp8_linear: the same
apply(module, input, bias) and post_load_weights hook as 1.1.0;
read at linear.py@ed53795b): class and method names, parameter lists, which method calls which,
the FP8 per-tensor attributes and the fused q/k/v, gate/up rescaling to the largest scale. Tensor
parallelism, LoRA and the other quant methods are left out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import Parameter


class WeightMode(str, enum.Enum):  # noqa: UP042 - upstream's base classes
    VANILLA = "vanilla"
    FUSED_QKV_LINEAR = "fused_qkv_linear"
    FUSED_GATE_UP_LINEAR = "fused_gate_up_linear"


@dataclass(kw_only=True)
class WeightsLoadingConfig:
    weight_mode: WeightMode = WeightMode.VANILLA
    ignore_tensor_parallel: bool = False


class TensorParallelMode(str, enum.Enum):  # noqa: UP042 - upstream's base classes
    COLUMN = "column"
    ROW = "row"


def copy_weight(dst: Parameter, src: torch.Tensor) -> None:
    dst.data.copy_(src.to(dst.dtype))


class LinearMethodBase:
    def create_weights(self, module, in_features, out_features, bias, dtype, *args, **kwargs):
        raise NotImplementedError

    def apply(self, module, input, bias, *args, **kwargs):
        raise NotImplementedError

    def load_weights(self, module: Linear, weights: list[dict], weight_mode: WeightMode):
        if weight_mode == WeightMode.VANILLA:
            self.load_weights_vanilla(module, weights)
        elif weight_mode == WeightMode.FUSED_QKV_LINEAR:
            self.load_weights_fused_qkv_linear(module, weights)
        elif weight_mode == WeightMode.FUSED_GATE_UP_LINEAR:
            self.load_weights_fused_gate_up_linear(module, weights)

    def post_load_weights(self, module: Linear):
        pass


class FP8QDQLinearMethod(LinearMethodBase):

    def create_weights(self, module: Linear, in_features: int, out_features: int, bias: bool,
                       dtype: torch.dtype):
        module.weight = Parameter(torch.empty((out_features, in_features), dtype=torch.float8_e4m3fn),
                                  requires_grad=False)
        module.weight_scale = Parameter(torch.tensor(1., dtype=torch.float32), requires_grad=False)
        module.input_scale = Parameter(torch.tensor(1., dtype=torch.float32), requires_grad=False)
        if bias:
            module.bias = Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
        else:
            module.register_parameter("bias", None)

    def apply(self, module: Linear, input: torch.Tensor, bias: torch.Tensor | None):
        cur_input_scale = module.input_scale
        if input.dtype != torch.float8_e4m3fn:
            qinput, _ = torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor(input, module.input_scale)
        else:
            qinput = input
        output = torch.ops.trtllm.cublas_scaled_mm(qinput, module.weight.t(), scale_a=cur_input_scale,
                                                   scale_b=module.weight_scale, bias=None,
                                                   out_dtype=module.dtype or input.dtype)
        if bias is not None:
            output = output + bias
        return output

    def _scales(self, weights: list[dict]):
        return ([w["input_scale"].reshape([]) for w in weights if "input_scale" in w],
                [w["weight_scale"].reshape([]) for w in weights if "weight_scale" in w])

    def load_weights_vanilla(self, module: Linear, weights: list[dict]) -> None:
        copy_weight(module.weight, weights[0]["weight"])
        if module.bias is not None:
            copy_weight(module.bias, weights[0]["bias"])
        input_scale, weight_scale = self._scales(weights)
        copy_weight(module.input_scale, input_scale[0])
        copy_weight(module.weight_scale, weight_scale[0])

    def _load_fused(self, module: Linear, weights: list[dict]) -> None:
        input_scale, weight_scale = self._scales(weights)
        copy_weight(module.input_scale, max(input_scale))
        copy_weight(module.weight_scale, max(weight_scale))
        parts = [w["weight"].to(module.dtype) * s for w, s in zip(weights, weight_scale, strict=True)]
        copy_weight(module.weight, (torch.cat(parts) / module.weight_scale).to(torch.float8_e4m3fn))

    load_weights_fused_qkv_linear = _load_fused
    load_weights_fused_gate_up_linear = _load_fused


class Linear(nn.Module):

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype = None,
                 tensor_parallel_mode: TensorParallelMode | None = None,
                 weights_loading_config: WeightsLoadingConfig | None = None,
                 force_dynamic_quantization: bool = False):
        super().__init__()
        self.has_bias = bias
        self.dtype = dtype
        self.weights_loading_config = weights_loading_config or WeightsLoadingConfig()
        self.tp_mode = tensor_parallel_mode
        self.force_dynamic_quantization = force_dynamic_quantization
        self.in_features = in_features
        self.out_features = out_features
        self.quant_method = FP8QDQLinearMethod()
        self.quant_method.create_weights(self, in_features, out_features, bias, dtype)

    def apply_linear(self, input, bias, lora_params: dict | None | None = None,
                     layer_idx: int | None | None = None):
        return self.quant_method.apply(self, input, bias)

    def forward(self, input, *, all_reduce_params=None, lora_params=None, layer_idx=None):
        return self.apply_linear(input, self.bias, lora_params, layer_idx)

    def load_weights(self, weights: list[dict]):
        self.quant_method.load_weights(self, weights, self.weights_loading_config.weight_mode)

    def post_load_weights(self):
        self.quant_method.post_load_weights(self)
