"""NVFP4 linears on CPU computed exactly: the same bits for one row or many.

An NVFP4 linear (ModelOpt's `NVFP4_DEFAULT_CFG`, TensorRT-LLM's NVFP4LinearMethod) multiplies
NVFP4 activations by NVFP4 weights: both are e2m1 values A (twice the value is an integer in
[-12, 12]) times an e4m3 block scale S (times 2^9 an integer below 2^18) times a float32 global
scale g, in blocks of 16 along the input dim. So

    y[r, n] = g_x * g_w / 2^20 * sum_k X[r, k] W[n, k],   X = Ax * Sx, W = Aw * Sw (integers)

with |X|, |W| <= 12 * 229 376 < 2^21.4, so each product is below 2^42.8 and any sum of up to
2^10 of them below 2^53: a float64 GEMM over a 1024-wide slice of K is exact whatever order or
blocking the BLAS uses (every partial sum is an integer float64 holds). The slices' sums are
added in int64 (exact for K < 2^19). The result is the exact dot product of the two NVFP4
tensors, rounded once to float64 and scaled by one float64 product of the global scales; no
step depends on how many rows are in the batch, so a 1-token decode and a 17-token verification
produce the same bits and greedy speculative decoding equals plain greedy decoding. The weight is
kept as its float64 integers (8 bytes a weight: this is the exact reference path, not a fast one).

Activations are quantized per row, as ModelOpt's NVFP4 input quantizer does (trtbuild.runtime.nvfp4_blocks:
dynamic e4m3 block scales, the static global scale `input_scale = input_amax / (6 * 448)` from
calibration, the row cast to float32 first). TensorRT-LLM's `fp4_quantize` kernel computes the
same quantities in its own reciprocal form on the GPU; whether its ties fall the same way was not
checked here (no GPU).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from trtbuild.runtime import nvfp4_blocks as nvfp4

SCALE_UNIT = 2.0 ** 9  # e4m3 value * 2^9 is an integer (the smallest subnormal is 2^-9)
VALUE_UNIT = 2.0  # e2m1 value * 2 is an integer
MAX_K = 2 ** 19  # the int64 sum of K / 1024 slice sums, each below 2^52.8, stays below 2^63
SLICE = 1024  # 1024 products below 2^42.8 each: every partial sum of a slice is below 2^53

# code -> 2 * e2m1 value, an exact small integer
_TWICE_VALUES = (nvfp4.E2M1_VALUES * VALUE_UNIT).to(torch.float32)


def _folded(q: nvfp4.NVFP4Weight) -> torch.Tensor:
    """[..., K] float64: 2 * e2m1 value * e4m3 scale * 2^9 of every element, an integer < 2^21.4."""
    codes = nvfp4.unpack(q.packed)
    a = _TWICE_VALUES[codes.long()].to(torch.float64)
    s = q.weight_scale.to(torch.float64) * SCALE_UNIT
    return (a.reshape(*a.shape[:-1], -1, nvfp4.BLOCK_SIZE) * s.unsqueeze(-1)).reshape(a.shape)


class ExactNvfp4Linear:
    """y = NVFP4(x; input_scale) . W^T exactly, W given as its export (packed, scales)."""

    __slots__ = ("n", "k", "w_int", "weight_scale_2", "input_scale", "bias", "out_scale")

    def __init__(self, packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                 input_scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """packed uint8 [N, K / 2], weight_scale float8_e4m3fn [N, K / 16], weight_scale_2 and
        input_scale float32 scalars: the tensors ModelOpt's export writes for one linear."""
        self.n, self.k = int(packed.shape[0]), int(packed.shape[1]) * 2
        if self.k % nvfp4.BLOCK_SIZE or tuple(weight_scale.shape) != (self.n, self.k // nvfp4.BLOCK_SIZE):
            raise ValueError(f"NVFP4 weight {tuple(packed.shape)} with block scales {tuple(weight_scale.shape)}: "
                             f"expected [{self.n}, {self.k // nvfp4.BLOCK_SIZE}]")
        if self.k > MAX_K:
            raise ValueError(f"K={self.k} exceeds the exact NVFP4 GEMM's {MAX_K}")
        self.weight_scale_2 = weight_scale_2.reshape(()).to(torch.float32)
        self.input_scale = input_scale.reshape(()).to(torch.float32)
        q = nvfp4.NVFP4Weight(packed, weight_scale, self.weight_scale_2, (self.n, self.k), torch.float32)
        self.w_int = _folded(q).t().contiguous()  # [K, N] float64 integers
        self.bias = None if bias is None else bias.to(torch.float64)
        self.out_scale = (self.input_scale.double() * self.weight_scale_2.double()
                          / (SCALE_UNIT * SCALE_UNIT * VALUE_UNIT * VALUE_UNIT))

    @classmethod
    def from_export(cls, tensors: dict[str, torch.Tensor], name: str) -> ExactNvfp4Linear:
        """The linear `name` (e.g. model.layers.0.mlp.down_proj) of an exported checkpoint."""
        return cls(tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"], tensors[f"{name}.weight_scale_2"],
                   tensors[f"{name}.input_scale"], tensors.get(f"{name}.bias"))

    def quantize_input(self, x: torch.Tensor) -> nvfp4.NVFP4Weight:
        return nvfp4.quantize(x.reshape(-1, self.k).to(torch.float32), scale_2=self.input_scale)

    def exact_sums(self, x: torch.Tensor) -> torch.Tensor:
        """int64 [rows, N]: the dot products in units of out_scale."""
        x_int = _folded(self.quantize_input(x))  # [R, K] float64 integers
        out = torch.zeros(x_int.shape[0], self.n, dtype=torch.int64)
        for start in range(0, self.k, SLICE):
            out += (x_int[:, start:start + SLICE] @ self.w_int[start:start + SLICE]).to(torch.int64)
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """float64 [..., N] for x [..., K] (any float dtype)."""
        y = self.exact_sums(x).to(torch.float64) * self.out_scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.n)

    def with_rows(self, reorder: Callable[[torch.Tensor], torch.Tensor]) -> ExactNvfp4Linear:
        """The same linear with its output rows permuted by `reorder` (applied to [N, ...] tensors),
        e.g. q/k rows in the runtime's RoPE order; the rows' integers move as they are."""
        out = copy.copy(self)
        out.w_int = reorder(self.w_int.t()).t().contiguous()
        out.bias = None if self.bias is None else reorder(self.bias)
        return out

    def dequantized_weight(self) -> torch.Tensor:
        """W as float64, exactly (A * S * g has at most 2 + 4 + 24 significant bits)."""
        return self.w_int.t() * (self.weight_scale_2.double() / (SCALE_UNIT * VALUE_UNIT))
