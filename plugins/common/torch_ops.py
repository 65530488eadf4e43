"""The plugins as torch custom ops (torch.library): one op for the PyTorch path and our runtime.

`torch.ops.trtbuild.<op>(x, w, scale_x, scale_w, n, k, out_dtype)` runs the Triton kernel on
CUDA tensors and the torch reference on CPU, and has a fake (meta) implementation so
torch.compile / CUDA-graph capture can trace through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_REGISTERED: dict[str, Any] = {}


def register(qualname: str, kernel: Callable[..., torch.Tensor],
             reference: Callable[..., torch.Tensor]) -> Any:
    """Define `qualname` ("trtbuild::name") once per process; return torch.ops.trtbuild.name."""
    if qualname in _REGISTERED:
        return _REGISTERED[qualname]

    @torch.library.custom_op(qualname, mutates_args=())
    def op(x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
           n: int, k: int, out_dtype: torch.dtype) -> torch.Tensor:
        if x.is_cuda:
            return kernel(x, w, scale_x, scale_w, n, k, out_dtype)
        return reference(x, w, scale_x, scale_w, n, k, out_dtype)

    @op.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
          n: int, k: int, out_dtype: torch.dtype) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], n), dtype=out_dtype)

    namespace, name = qualname.split("::")
    _REGISTERED[qualname] = getattr(getattr(torch.ops, namespace), name)
    return _REGISTERED[qualname]
