"""Stand-in for tensorrt_llm/_torch/modules/linear.py of TensorRT-LLM main@00bbf71 (not TensorRT-LLM).

Minimal and faithful to the recorded facts (trtbuild/core/contract/trtllm-main-0004396.yaml, fp8_linear,
read at linear.py@00bbf71): FP8QDQLinearMethod derives from UnquantizedLinearMethod, apply takes
(module, input, bias, output_buffer_kind, group), apply_window_output asks for an NCCL-window buffer,
load_weights takes allow_partial_loading and runs process_weights_after_loading (fused rescaling)
before the loader's post_load_weights.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import Parameter


class BufferKind(enum.IntEnum):  # tensorrt_llm._torch.custom_ops.torch_custom_ops.BufferKind
    DEFAULT = 0
    NCCL_WINDOW = 1


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
    def load_weights(self, module: Linear, weights: list[dict], weight_mode: WeightMode,
                     allow_partial_loading: bool = False):
        if weight_mode == WeightMode.VANILLA:
            self.load_weights_vanilla(module, weights, allow_partial_loading=allow_partial_loading)
        else:
            self.load_weights_fused(module, weights, allow_partial_loading=allow_partial_loading)
        if not allow_partial_loading:
            self.process_weights_after_loading(module)

    def post_load_weights(self, module: Linear):
        pass

    def process_weights_after_loading(self, module: Linear):
        pass


class UnquantizedLinearMethod(LinearMethodBase):
    pass


class FP8QDQLinearMethod(UnquantizedLinearMethod):

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

    def apply(self, module: Linear, input: torch.Tensor, bias: torch.Tensor | None,
              output_buffer_kind: int = int(BufferKind.DEFAULT), group: list[int] | None = None):
        original_shape = input.shape
        if input.dim() > 2:
            input = input.reshape(-1, input.shape[-1])
        cur_input_scale = module.input_scale
        if input.dtype != torch.float8_e4m3fn:
            qinput, _ = torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor(input, module.input_scale)
        else:
            qinput = input
        output = torch.ops.trtllm.cublas_scaled_mm(qinput, module.weight.t(), scale_a=cur_input_scale,
                                                   scale_b=module.weight_scale, bias=None,
                                                   out_dtype=module.dtype or input.dtype,
                                                   output_buffer_kind=output_buffer_kind, group=group)
        if len(original_shape) > 2:
            output = output.reshape(*original_shape[:-1], output.shape[-1])
        if bias is not None:
            output = output + bias
        return output

    def apply_window_output(self, module: Linear, input: torch.Tensor, bias: torch.Tensor | None):
        return self.apply(module, input, bias, output_buffer_kind=int(BufferKind.NCCL_WINDOW), group=[0])

    def load_weights_vanilla(self, module: Linear, weights: list[dict],
                             allow_partial_loading: bool = False) -> None:
        copy_weight(module.weight, weights[0]["weight"])
        if module.bias is not None:
            copy_weight(module.bias, weights[0]["bias"])
        copy_weight(module.input_scale, weights[0]["input_scale"].reshape([]))
        copy_weight(module.weight_scale, weights[0]["weight_scale"].reshape([]))

    def load_weights_fused(self, module: Linear, weights: list[dict],
                           allow_partial_loading: bool = False) -> None:
        module._parts = [(w["weight"], w["weight_scale"].reshape([])) for w in weights]
        copy_weight(module.input_scale, max(w["input_scale"].reshape([]) for w in weights))

    def process_weights_after_loading(self, module: Linear):
        parts = module.__dict__.pop("_parts", None)
        if parts is None:
            return
        scale = max(s for _, s in parts)
        copy_weight(module.weight_scale, scale)
        fused = torch.cat([w.to(module.dtype) * s for w, s in parts]) / scale
        copy_weight(module.weight, fused.to(torch.float8_e4m3fn))


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

    def forward(self, input, *, all_reduce_params=None, prefer_window_output=None, lora_params=None,
                layer_idx=None):
        if prefer_window_output:  # row-parallel output feeding an all-reduce through an NCCL window
            return self.quant_method.apply_window_output(self, input, self.bias)
        return self.apply_linear(input, self.bias, lora_params, layer_idx)

    def load_weights(self, weights: list[dict], allow_partial_loading: bool = False):
        self.quant_method.load_weights(self, weights, self.weights_loading_config.weight_mode,
                                       allow_partial_loading=allow_partial_loading)

    def process_weights_after_loading(self):
        self.quant_method.process_weights_after_loading(self)

    def post_load_weights(self):
        self.quant_method.post_load_weights(self)
