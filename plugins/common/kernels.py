"""The two FP8 GEMM kernels by plugin name, and their torch ops: what every backend calls.

Import-light (torch, triton and the kernel modules load on first use) and free of
trtbuild imports: this package also travels inside the engine bundle, where TensorRT-LLM's server
imports it (plugins/trtllm_module) and only torch + triton are there.

    run("spatial_partition", x_fp8, w_shuffled, scale_x, scale_w, n, k, torch.bfloat16)
    op = torch_op("spatial_partition")   # torch.ops.trtbuild.fp8_gemm_ws
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class KernelSpec:
    op: str  # "trtbuild::<name>" of its torch.library op
    module: str  # kernel module, relative to this package's parent ("plugins" or its bundled copy)
    attr: str  # the DualKernel in that module
    tma: bool  # reads x and W through TMA descriptors
    ctas_per_sm: int  # CTAs one SM holds (split-K sizes one wave with it)


KERNELS: dict[str, KernelSpec] = {
    "gemm_weight_shuffle": KernelSpec("trtbuild::fp8_gemm_shuffled", "gemm_weight_shuffle.kernel",
                                      "fp8_gemm_shuffled_kernel", tma=False, ctas_per_sm=2),
    # The partitions claim the whole register file (setmaxnreg): one CTA per SM.
    "spatial_partition": KernelSpec("trtbuild::fp8_gemm_ws", "spatial_partition.kernel",
                                    "fp8_gemm_ws_kernel", tma=True, ctas_per_sm=1),
}

_ROOT = __package__.rsplit(".", 1)[0]  # "plugins", or the bundle's copy of it


def spec(name: str) -> KernelSpec:
    if name not in KERNELS:
        raise KeyError(f"unknown GEMM kernel '{name}'; known: {', '.join(KERNELS)}")
    return KERNELS[name]


def triton_kernel(name: str) -> Any:
    """The DualKernel (compiled + interpreted) of a plugin."""
    s = spec(name)
    return getattr(importlib.import_module(f"{_ROOT}.{s.module}"), s.attr)


def run(name: str, x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
        n: int, k: int, out_dtype: torch.dtype | None = None, **options: Any) -> torch.Tensor:
    """The Triton kernel: compiled on CUDA tensors, the interpreter on CPU tensors."""
    from .launch import launch_fp8_gemm

    s = spec(name)
    return launch_fp8_gemm(triton_kernel(name), x, w, scale_x, scale_w, n, k, out_dtype, tma=s.tma,
                           ctas_per_sm=s.ctas_per_sm, **options)


def torch_op(name: str) -> Any:
    """torch.ops.trtbuild.<op> of a plugin: the kernel on CUDA, the torch reference on CPU."""
    from .reference import fp8_gemm_reference
    from .torch_ops import register

    def kernel(x: torch.Tensor, w: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, n: int, k: int,
               out_dtype: torch.dtype) -> torch.Tensor:
        return run(name, x, w, sx, sw, n, k, out_dtype)

    return register(spec(name).op, kernel, fp8_gemm_reference)
