"""Stand-ins for the two TensorRT-LLM CUDA ops FP8QDQLinearMethod.apply calls (their real kernels are
C++ in TensorRT-LLM's wheel, which cannot be installed here). Same names and call signatures as the
recorded facts (trtbuild/core/contract/*.yaml, fp8_linear); float32 math on CPU.

Not TensorRT-LLM: these exist so tests can drive the recorded calling conventions.
"""

from __future__ import annotations

import torch

CALLS = {"static_quantize": 0, "cublas_scaled_mm": 0}
_lib_q = torch.library.Library("tensorrt_llm", "DEF")
_lib_q.define("static_quantize_e4m3_per_tensor(Tensor input, Tensor scale) -> (Tensor, Tensor)")
_lib_mm = torch.library.Library("trtllm", "DEF")
_lib_mm.define("cublas_scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
               "ScalarType? out_dtype, int output_buffer_kind=0, int[]? group=None) -> Tensor")


def _quantize(input: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    CALLS["static_quantize"] += 1
    q = (input.float() * (1.0 / scale.float())).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale.float().reshape(1)


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               bias: torch.Tensor | None, out_dtype: torch.dtype | None, output_buffer_kind: int = 0,
               group: list[int] | None = None) -> torch.Tensor:
    CALLS["cublas_scaled_mm"] += 1
    y = (a.float() @ b.float()) * (scale_a.float().reshape(()) * scale_b.float().reshape(()))
    return y.to(out_dtype or torch.bfloat16)


_lib_q.impl("static_quantize_e4m3_per_tensor", _quantize, "CPU")
_lib_mm.impl("cublas_scaled_mm", _scaled_mm, "CPU")
