"""One Triton kernel, two ways to run it: compiled (CUDA) and interpreted (CPU).

`triton.jit` picks one of the two once, at import, from TRITON_INTERPRET. We build both from the
plain function instead, so one process can run kernels on CPU tensors (the interpreter: tests,
dry runs) and still hand the real JITFunction to `triton.compile` for the AOT build.
Kernels built this way must not call @triton.jit functions, including triton.language's own
(tl.zeros, tl.cdiv, reductions): those were built for one mode at import and fail in the other.
Use builtins (tl.full, integer arithmetic) instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

# Passed explicitly to every compile (JIT launches and the AOT build) so both build the same code;
# leaving it unset makes triton 3.9 warn that its default changes in 3.10.
FP_FUSION = True


class DualKernel:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.jit = JITFunction(fn)
        self.interpreted = InterpretedFunction(fn)

    def for_device(self, device: torch.device) -> Any:
        """The launchable kernel for tensors on `device` (interpreter for CPU or TRITON_INTERPRET=1)."""
        if device.type == "cpu" or os.environ.get("TRITON_INTERPRET", "0") == "1":
            return self.interpreted
        return self.jit


def dual_jit(fn: Callable[..., Any]) -> DualKernel:
    return DualKernel(fn)


def _torch_allocator(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, device="cuda", dtype=torch.int8)


def ensure_allocator(device: torch.device) -> None:
    """Kernels that build TMA descriptors on the device need global scratch from an allocator.

    Triton keeps the allocator in a ContextVar that starts as a NullAllocator that raises; install
    a torch one only when nobody has set one (private module: checked here, at one place).
    """
    from triton.runtime import _allocation

    if device.type == "cuda" and isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_allocator)
