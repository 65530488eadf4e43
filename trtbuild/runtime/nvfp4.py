"""NVFP4 linears on CPU computed exactly: the same bits for one row or many.

An NVFP4 linear (ModelOpt's `NVFP4_DEFAULT_CFG`, TensorRT-LLM's NVFP4LinearMethod) multiplies
NVFP4 activations by NVFP4 weights: both are e2m1 values A (twice the value is an integer in
[-12, 12]) times an e4m3 block scale S (times 2^9 an integer below 2^18) times a float32 global
scale g, in blocks of 16 along the input dim. So

    y[r, n] = g_x * g_w / 2^20 * sum_b Sx[r, b] Sw[n, b] * sum_{k in b} Ax[r, k] Aw[n, k]

with every factor of the sum an integer: the inner block sum is at most 16 * 144 = 2304 in size
(exact in float32 whatever order a kernel adds in), and the outer sum is done in int64 (each
term below 2^47.6, exact for K < 2^19). The result is the exact dot product of the two NVFP4
tensors, rounded once to float64 and scaled by one float64 product of the global scales; no
step depends on how many rows are in the batch, so a 1-token decode and a 17-token verification
produce the same bits and greedy speculative decoding equals plain greedy decoding.

Activations are quantized per row, as ModelOpt's NVFP4 input quantizer does (trtbuild.nvfp4:
dynamic e4m3 block scales, the static global scale `input_scale = input_amax / (6 * 448)` from
calibration, the row cast to float32 first). TensorRT-LLM's `fp4_quantize` kernel computes the
same quantities in its own reciprocal form on the GPU; whether its ties fall the same way was not
checked here (no GPU).
"""

from __future__ import annotations

import torch

from trtbuild import nvfp4

SCALE_UNIT = 2.0 ** 9  # e4m3 value * 2^9 is an integer (the smallest subnormal is 2^-9)
VALUE_UNIT = 2.0  # e2m1 value * 2 is an integer
MAX_K = 2 ** 19  # the int64 sum of K / 16 block terms, each below 2^47.6, stays below 2^63
CHUNK = 1 << 22  # elements of one [blocks, rows, outputs] int64 partial product

# code -> 2 * e2m1 value, as an exact small integer (float32 for the block GEMM)
_TWICE_VALUES = (nvfp4.E2M1_VALUES * VALUE_UNIT).to(torch.float32)


def _integers(q: nvfp4.NVFP4Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [..., B, 16] float32 integers in [-12, 12], S [..., B] int64 integers < 2^18)."""
    codes = nvfp4.unpack(q.packed)
    a = _TWICE_VALUES[codes.long()]
    s = (q.weight_scale.to(torch.float64) * SCALE_UNIT).to(torch.int64)
    return a.reshape(*a.shape[:-1], -1, nvfp4.BLOCK_SIZE), s


class ExactNvfp4Linear:
    """y = NVFP4(x; input_scale) . W^T exactly, W given as its export (packed, scales)."""

    __slots__ = ("n", "k", "a_w", "s_w", "weight_scale_2", "input_scale", "bias", "out_scale")

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
        a_w, self.s_w = _integers(q)
        self.a_w = a_w.permute(1, 2, 0).contiguous()  # [B, 16, N] for the block GEMM
        self.s_w = self.s_w.t().contiguous()  # [B, N]
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
        a_x, s_x = _integers(self.quantize_input(x))  # [R, B, 16], [R, B]
        rows, blocks = s_x.shape
        a_x = a_x.transpose(0, 1).contiguous()  # [B, R, 16]
        s_x = s_x.t().contiguous()  # [B, R]
        out = torch.empty(rows, self.n, dtype=torch.int64)
        step = max(1, CHUNK // max(1, blocks * rows))
        for start in range(0, self.n, step):
            end = min(self.n, start + step)
            inner = torch.bmm(a_x, self.a_w[:, :, start:end]).to(torch.int64)  # [B, R, n]: |.| <= 2304
            scales = s_x.unsqueeze(2) * self.s_w[:, start:end].unsqueeze(1)  # [B, R, n] < 2^36
            out[:, start:end] = (inner * scales).sum(0)
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """float64 [..., N] for x [..., K] (any float dtype)."""
        y = self.exact_sums(x).to(torch.float64) * self.out_scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.n)

    def dequantized_weight(self) -> torch.Tensor:
        """W as float64, exactly (A * S * g has at most 2 + 4 + 24 significant bits)."""
        a = self.a_w.permute(2, 0, 1).to(torch.float64)  # [N, B, 16]
        s = self.s_w.t().to(torch.float64).unsqueeze(-1)
        return (a * s).reshape(self.n, self.k) * (self.weight_scale_2.double() / (SCALE_UNIT * VALUE_UNIT))
