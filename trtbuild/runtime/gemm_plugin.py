"""The runtime's FP8 decode GEMM: the GEMM plugins' torch ops, dispatched like the TensorRT-LLM module.

A linear with an FP8 per-tensor weight keeps its dequantized copy for its own path and, when a
plugin is active, the weight shuffled once into the plugin layout (plugins/common/layout.shuffle,
the same shuffle the bundle's module runs): calls with at most MAX_TOKENS tokens go to the op.

TRTBUILD_GEMM picks the path (read once, at load):
    unset       CUDA: spatial_partition on sm_90a / sm_100a, gemm_weight_shuffle on sm_89 / sm_120a;
                CPU: off (the op's dispatcher costs ~30 us a call, as much as a tiny decode GEMM)
    reference   the ops on CPU too (their torch reference, float64 for a float64 model)
    spatial_partition | gemm_weight_shuffle   that kernel (CUDA)
    scaled_mm   torch._scaled_mm on the FP8 operands (CUDA; the baseline scripts/gpu_check.py times)
    off         no plugin
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trtbuild.core import plugins

MAX_TOKENS = 16
FP8 = torch.float8_e4m3fn
_KERNEL_BY_ARCH = {"sm_90a": "spatial_partition", "sm_100a": "spatial_partition",
                   "sm_89": "gemm_weight_shuffle", "sm_120a": "gemm_weight_shuffle"}


def mode_for(device: torch.device) -> str:
    mode = os.environ.get("TRTBUILD_GEMM", "").strip().lower()
    if mode:
        return mode
    if device.type != "cuda":
        return "off"
    from plugins.common.arch import arch_of_capability

    arch = arch_of_capability(*torch.cuda.get_device_capability(device))
    return _KERNEL_BY_ARCH.get(arch or "", "off")


class Fp8Gemm:
    """y = fp8(x * inv) @ W_fp8^T * (1/inv) * weight_scale for decode-sized x."""

    __slots__ = ("mode", "op", "weight", "n", "k", "scale_x", "scale_w", "out_dtype")

    def __init__(self, mode: str, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, inv_scale: torch.Tensor,
                 out_dtype: torch.dtype) -> None:
        from plugins.common.arch import ARCHS, arch_of_capability
        from plugins.common.layout import shuffle

        self.mode = mode
        self.n, self.k = (int(d) for d in weight_fp8.shape)
        self.scale_w = weight_scale.to(weight_fp8.device, torch.float32).reshape(1)
        self.scale_x = (1.0 / inv_scale.to(torch.float32)).to(weight_fp8.device).reshape(1)
        self.out_dtype = out_dtype
        if mode == "scaled_mm":
            self.weight, self.op = weight_fp8.contiguous(), None
            return
        kernel = "spatial_partition" if mode == "reference" else mode

        arch = (arch_of_capability(*torch.cuda.get_device_capability(weight_fp8.device))
                if weight_fp8.is_cuda else None) or "sm_90a"
        tile = ARCHS[arch]
        self.weight = shuffle(weight_fp8, tile.block_n, tile.block_k)
        if weight_fp8.is_cuda:
            self.op = plugins.get(kernel).torch_op
        else:  # the op's CPU implementation itself, without the dispatcher's per-call cost
            from plugins.common.reference import fp8_gemm_reference

            self.op = fp8_gemm_reference

    @staticmethod
    def create(weight_fp8: torch.Tensor, weight_scale: torch.Tensor, inv_scale: torch.Tensor,
               out_dtype: torch.dtype) -> Fp8Gemm | None:
        mode = mode_for(weight_fp8.device)
        if mode == "off" or weight_scale.numel() != 1:
            return None
        return Fp8Gemm(mode, weight_fp8, weight_scale, inv_scale, out_dtype)

    def __call__(self, x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
        q = (x * inv_scale).clamp(-448.0, 448.0).to(FP8).reshape(-1, self.k)
        if self.op is None:
            y = _scaled_mm(q, self.weight, self.scale_x, self.scale_w, self.out_dtype)
        else:
            y = self.op(q, self.weight, self.scale_x, self.scale_w, self.n, self.k, self.out_dtype)
        return y.reshape(*x.shape[:-1], self.n)


def _scaled_mm(q: torch.Tensor, w: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, out: Any) -> torch.Tensor:
    m = q.shape[0]
    pad = (-m) % 16  # cuBLASLt's FP8 GEMM wants M in multiples of 16 on some versions
    if pad:
        q = torch.cat([q, q.new_zeros(pad, q.shape[1])])
    dtype = out if out in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
    y = torch._scaled_mm(q, w.t(), scale_a=sx.reshape(()), scale_b=sw.reshape(()), out_dtype=dtype)
    return y[:m].to(out)
