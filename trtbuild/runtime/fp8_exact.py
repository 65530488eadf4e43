"""FP8 GEMMs on CPU computed exactly, in integers: the same bits for any number of rows.

CPUs have no FP8 GEMM. An e4m3 value times 2^9 is an integer of at most 18 bits (448 * 2^9 =
229 376; the smallest subnormal, 2^-9, becomes 1), so the dot product of an FP8 input row with
an FP8 weight row is an integer too. It is computed as such:

- each weight integer is split into three signed 7-bit planes (bits 0-6, 7-13, 14-17), int8, and
  each input integer into three signed 6-bit planes (bits 0-5, 6-11, 12-17);
- one int8 GEMM multiplies every input plane by every weight plane. A plane pair sums at most
  63 * 127 * K: below 2^24 for K <= 2096 (oneDNN's prepacked u8 x s8 GEMM, float32 output, the
  fast path) and below 2^31 otherwise (`torch._int_mm`, int32 output);
- the nine plane products are summed in float64 with their powers of two. Every partial sum is an
  integer no larger than sum_k |q_k w_k| <= K * 2^35.6 < 2^53, so float64 holds it exactly.

From ROWS_FOR_FLOAT64 rows on (in-flight batches, prefill) the same integers go through one float64
GEMM instead: every product is below 2^36 and every partial sum below 2^53, so float64 holds each
exactly in any summation order and the result is the same integer, for one GEMM instead of nine plus
the planes' bookkeeping (the weight's float64 copy is made at the first such call: decode alone never
pays its 8 bytes a weight).

The result is the exact dot product whatever order any kernel sums in, so a 1-token decode and a
17-token verification compute the same bits: greedy speculative decoding equals plain greedy
decoding by construction. The per-tensor (or per-row) scales multiply the exact sum once. The
weight costs 3 bytes per element to stream, where the float64 form it replaces costs 8. Each
backend is checked once per process against int64 arithmetic on worst-case operands (a CPU whose
int8 instructions saturate, e.g. without VNNI, fails it and falls back).
"""

from __future__ import annotations

import functools

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
GRID_UNIT = 2.0 ** 9  # e4m3 value * 2^9 is an integer
PLANES = 3
WEIGHT_BITS, INPUT_BITS = 7, 6
ONEDNN_MAX_K = (2 ** 24) // (63 * 127)  # a plane pair's sum stays exact in float32
MAX_K = 2 ** 17  # the float64 sum of the nine plane products stays below 2^53
U8_OFFSET = 128  # oneDNN's activations are uint8 with a zero point
# Rows from which the float64 GEMM replaces the nine int8 plane GEMMs. bench/fp8_gemm_rows.py, one thread
# of the 2-core CI class, float64 / int8 time over two runs: at 6 rows 1.5-1.7 on SmolLM2's large linears
# (the planes win); at 12 rows 1.03-1.17 there but 0.58-0.77 on SmolLM2's k/v and the tiny target's; at 48
# rows 0.79-1.00 on the large ones and 0.58-0.74 on the rest. Chosen end to end on the tiny recipe (8
# concurrent streams: bench/serve_batching.py); SmolLM2's large linears gain nothing below ~24 rows.
ROWS_FOR_FLOAT64 = 12


def _planes(bits: int) -> torch.Tensor:
    """[PLANES, 256] int16: the signed `bits`-bit planes of every float8_e4m3fn bit pattern (NaN
    patterns: 0; the runtime saturates before rounding, so they never occur)."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).to(torch.float64)
    ints = (torch.nan_to_num(values, nan=0.0) * GRID_UNIT).to(torch.int64)
    sign, magnitude = ints.sign(), ints.abs()
    mask = (1 << bits) - 1
    return torch.stack([((magnitude >> (bits * p)) & mask) * sign for p in range(PLANES)]).to(torch.int16)


WEIGHT_PLANES = _planes(WEIGHT_BITS).to(torch.int8)
INPUT_PLANES = _planes(INPUT_BITS).to(torch.int8)
INPUT_PLANES_U8 = (_planes(INPUT_BITS) + U8_OFFSET).to(torch.uint8)
WEIGHT_FACTORS = torch.tensor([2.0 ** (WEIGHT_BITS * p) for p in range(PLANES)], dtype=torch.float64)
INPUT_FACTORS = torch.tensor([2.0 ** (INPUT_BITS * p) for p in range(PLANES)], dtype=torch.float64)


def available() -> bool:
    return _int_mm_exact()


def grid_of(weight: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor | None:
    """The float8 weight a dequantized weight came from, or None if it did not.

    weight [N, K] is `(w_fp8.to(float32) * scale).to(dtype)` as trtbuild.runtime.checkpoint
    dequantizes it; row_scale [N] (float32) is its per-row (or expanded per-tensor) scale. The
    candidate is accepted only if dequantizing it again gives `weight` bit for bit."""
    scale = row_scale.to(torch.float32).reshape(-1, 1)
    candidate = (weight.to(torch.float64) / scale.to(torch.float64)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    again = (candidate.to(torch.float32) * scale).to(weight.dtype)
    return candidate if torch.equal(again, weight) else None


def _worst_case(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input planes [6, k] and weight planes [8, k] at the bounds: every sign pattern of full-size
    planes, where a saturating or approximate int8 kernel goes wrong."""
    inputs = torch.tensor([63, -63], dtype=torch.int8).repeat_interleave(3).view(6, 1).repeat(1, k)
    inputs[2::3, ::2] *= -1
    weights = torch.tensor([127, -127, 127, -127], dtype=torch.int8).repeat_interleave(2).view(8, 1).repeat(1, k)
    weights[1::2, 1::3] = 127
    return inputs, weights


@functools.cache
def _int_mm_exact() -> bool:
    if not hasattr(torch, "_int_mm"):
        return False
    inputs, weights = _worst_case(4096)
    try:
        got = torch._int_mm(inputs, weights.t().contiguous())
    except RuntimeError:
        return False
    return torch.equal(got.to(torch.int64), inputs.to(torch.int64) @ weights.to(torch.int64).t())


@functools.cache
def _onednn_exact() -> bool:
    ops = getattr(torch.ops, "onednn", None)
    if ops is None or not hasattr(ops, "qlinear_prepack") or not hasattr(ops, "qlinear_pointwise"):
        return False
    inputs, weights = _worst_case(ONEDNN_MAX_K)
    try:
        packed = ops.qlinear_prepack(weights, [inputs.shape[0], ONEDNN_MAX_K])
        got = _onednn_mm((inputs.to(torch.int16) + U8_OFFSET).to(torch.uint8), packed,
                         torch.ones(weights.shape[0]), torch.zeros(weights.shape[0], dtype=torch.int64))
    except (RuntimeError, NotImplementedError):
        return False
    return torch.equal(got.to(torch.int64), inputs.to(torch.int64) @ weights.to(torch.int64).t())


def _onednn_mm(inputs_u8: torch.Tensor, packed: torch.Tensor, ones: torch.Tensor, zeros: torch.Tensor
               ) -> torch.Tensor:
    """(inputs_u8 - 128) @ W^T as float32, W prepacked by oneDNN (exact while it stays below 2^24)."""
    return torch.ops.onednn.qlinear_pointwise(inputs_u8, 1.0, U8_OFFSET, packed, ones, zeros, None, 1.0, 0,
                                              torch.float32, "none", [None], "")


class ExactFp8Gemm:
    """y = fp8(x * inv) @ W_fp8^T * row_scale / inv, the dot products exact (see module doc)."""

    __slots__ = ("inv", "grid", "packed", "planes", "ones", "zeros", "out_scale", "n", "k", "grid64_t")

    def __init__(self, weight_fp8: torch.Tensor, row_scale: torch.Tensor, inv: torch.Tensor) -> None:
        """weight_fp8 [N, K] float8_e4m3fn; row_scale [N] its dequantization scale per output row;
        inv the factor the input is multiplied by before rounding (448 / amax, as `Linear`)."""
        self.n, self.k = (int(d) for d in weight_fp8.shape)
        if self.k > MAX_K:
            raise ValueError(f"K={self.k} exceeds the exact int8 GEMM's {MAX_K}")
        self.inv = inv.to(torch.float64)
        self.grid = weight_fp8.contiguous()  # 1 byte a weight: `dequantized` and nothing else reads it
        codes = self.grid.view(torch.uint8).reshape(-1).to(torch.int64)
        # row n * PLANES + j: plane j of weight row n (the planes of one output sit side by side)
        planes = WEIGHT_PLANES[:, codes].view(PLANES, self.n, self.k).transpose(0, 1).reshape(PLANES * self.n, self.k)
        self.packed = self.planes = None
        if self.k <= ONEDNN_MAX_K and _onednn_exact():
            self.packed = torch.ops.onednn.qlinear_prepack(planes, [PLANES, self.k])
            self.ones = torch.ones(PLANES * self.n)
            self.zeros = torch.zeros(PLANES * self.n, dtype=torch.int64)
        else:
            self.planes = planes.t().contiguous()  # [K, PLANES * N] for torch._int_mm
        self.out_scale = row_scale.to(torch.float64).reshape(self.n) / self.inv / (GRID_UNIT * GRID_UNIT)
        self.grid64_t: torch.Tensor | None = None  # [K, N] float64 integers, made at the first large call

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.k
        q = (x.reshape(rows, self.k).to(torch.float64) * self.inv).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
        exact = self._float64_sums(q) if rows >= ROWS_FOR_FLOAT64 else self._plane_sums(q, rows)
        out = (exact * self.out_scale).view(*x.shape[:-1], self.n)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def _float64_sums(self, q: torch.Tensor) -> torch.Tensor:
        """[rows, N]: the integer dot products as one float64 GEMM (every partial sum below 2^53: exact)."""
        if self.grid64_t is None:  # made at the first large call: decode alone never holds it
            self.grid64_t = (self.grid.to(torch.float64) * GRID_UNIT).t().contiguous()
        return (q.to(torch.float64) * GRID_UNIT) @ self.grid64_t

    def _plane_sums(self, q: torch.Tensor, rows: int) -> torch.Tensor:
        """[rows, N]: the same integers from nine int8 plane GEMMs, folded in float64."""
        codes = q.view(torch.uint8).reshape(-1).to(torch.int64)
        if self.packed is not None:
            q_planes = INPUT_PLANES_U8.index_select(1, codes).view(PLANES * rows, self.k)
            products = _onednn_mm(q_planes, self.packed, self.ones, self.zeros).to(torch.float64)
        else:
            q_planes = INPUT_PLANES.index_select(1, codes).view(PLANES * rows, self.k)
            products = torch._int_mm(q_planes, self.planes).to(torch.float64)
        # products [PLANES * rows, N * PLANES]: input plane i of row m times weight plane j of row n
        by_input = torch.mv(products.view(-1, PLANES), WEIGHT_FACTORS).view(PLANES, rows * self.n)
        return torch.mv(by_input.t(), INPUT_FACTORS).view(rows, self.n)  # integers below 2^53

    def dequantized(self) -> torch.Tensor:
        """[N, K] float64: the weight with the input's dequantization folded in (y = fp8(x*inv) @ this^T)."""
        return self.grid.to(torch.float64) * (self.out_scale * GRID_UNIT * GRID_UNIT).reshape(-1, 1)
