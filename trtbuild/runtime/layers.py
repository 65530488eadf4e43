"""The arithmetic the runtime is made of: linears (plain or FP8), RMSNorm, RoPE, attention.

FP8 follows ModelOpt's unified export: a linear's weight is float8_e4m3fn with a float32
`weight_scale`, and its input is quantized per tensor with the calibrated `input_scale`
(x -> fp8(x / input_scale) * input_scale), so the numbers are those an FP8 GEMM with float32
accumulation would produce. CPUs have no FP8 GEMM: on CPU the FP8 dot products are computed
exactly in integers (trtbuild.runtime.fp8_exact); elsewhere, or for a weight that is not on the
FP8 grid, the weight is dequantized once with the input scale folded in, leaving one rounding of
the input to the FP8 grid per call.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from trtbuild.runtime import fp8_exact
from trtbuild.runtime.gemm_plugin import Fp8Gemm
from trtbuild.runtime.nvfp4 import ExactNvfp4Linear

FP8_MAX = fp8_exact.FP8_MAX  # largest finite float8_e4m3fn
HALF_DTYPES = (torch.bfloat16, torch.float16)  # computed through float32 where an op needs it


def fp8_round(x: torch.Tensor) -> torch.Tensor:
    """Rounds (already scaled) values to the e4m3 grid, saturating like ModelOpt's fake quant."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def fake_quant_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x on the FP8 grid of a per-tensor scale (= amax / 448), as ModelOpt's fake quantizer."""
    return FakeQuantFP8(scale)(x)


class FakeQuantFP8:
    """`fake_quant_fp8` with its two factors computed once (a KV cache's scale is fixed at load):
    the same values, four fewer ops per call."""

    __slots__ = ("inv", "deq")

    def __init__(self, scale: torch.Tensor) -> None:
        self.inv = 448.0 / (scale * 448.0)
        self.deq = 1.0 / self.inv

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_round(x * self.inv) * self.deq


# Rows from which a GEMM runs as x @ W^T on the [out, in] weight (below: W @ x^T, the weight as
# the streamed operand; one row: x @ W_t, a GEMV). Measured with MKL on the 2-core AMD EPYC CI
# class, one thread, the tiny target's 25 float64 GEMMs per forward: 1 row 2.3 ms (GEMV) vs 3.7;
# 6 rows 5.3 ms vs 8.5 (x @ W_t) and 7.5 (x @ W^T); 48 rows 13.1 ms (x @ W^T) vs 15.5 (x @ W_t).
# Float32 on SmolLM2's head (49 152 x 576, 2 threads): 4 rows 4.7 ms as W @ x^T vs 19.2 as x @ W_t.
ROWS_FOR_XWT = 8


def gemm_by_rows(x: torch.Tensor, weight_t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ W in the fastest of three equal-valued forms for its row count; weight_t
    [in, out] and weight [out, in] are both contiguous. Each form sums in its own order; in
    float64 that differs by ~1e-16, far below an FP8 rounding step (see `Linear`); a float32
    caller bounds it (trtbuild.runtime.lm_head)."""
    rows = x.numel() // x.shape[-1]
    if rows == 1:
        return x @ weight_t
    if rows < ROWS_FOR_XWT:
        flat = x.reshape(rows, x.shape[-1])
        return (weight @ flat.t()).t().contiguous().view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight)


class LinearParts(NamedTuple):
    """What a linear is built from, as trtbuild.runtime.checkpoint reads it."""

    weight: torch.Tensor  # [out, in], compute dtype (FP8: dequantized)
    bias: torch.Tensor | None
    input_scale: torch.Tensor | None  # FP8: the calibrated per-tensor input scale
    weight_scale: torch.Tensor | None = None  # FP8: float32, per tensor (one element) or per row [out]
    nvfp4: ExactNvfp4Linear | None = None  # NVFP4: the exact W4A4 linear (weight above: dequantized)


class Linear:
    """y = x W^T (+ b). With `input_scale`, x is rounded to FP8 first (per-tensor scale).

    The weight is kept transposed ([in, out], contiguous): on CPU `x @ W_t` runs 15-20% faster
    than F.linear for the 1-16 rows of a float32 decode or verification step. An FP8 weight on CPU
    whose `weight_scale` is known is kept as integer planes instead (`fp8_exact`: exact dot
    products, 3 bytes a weight). Any other FP8 weight accumulates in float64 and is also kept as
    [out, in] for `gemm_by_rows` (twice the memory of that weight: the FP8-on-CPU path is for models
    small enough to run on a CPU at all).
    """

    __slots__ = ("weight_t", "weight_rows", "bias", "inv_scale", "plugin", "exact", "nvfp4", "nvfp4_dtype")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 input_scale: torch.Tensor | None = None, weight_scale: torch.Tensor | None = None,
                 nvfp4: ExactNvfp4Linear | None = None, *,
                 fp8: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """fp8: the checkpoint's (float8 weight, per-tensor weight_scale); with an input scale, decode-sized
        calls go to the GEMM plugins' op (trtbuild/runtime/gemm_plugin.py) when one is active.
        nvfp4: an NVFP4 linear, computed exactly (trtbuild.runtime.nvfp4; no GEMM plugin takes it)."""
        self.exact: fp8_exact.ExactFp8Gemm | None = None
        self.weight_t: torch.Tensor | None = None
        self.weight_rows: torch.Tensor | None = None
        self.nvfp4 = nvfp4
        self.nvfp4_dtype = weight.dtype
        if nvfp4 is not None:
            self.inv_scale: torch.Tensor | None = None
            self.bias = bias
            self.plugin = None
            return
        if input_scale is not None:
            # ModelOpt rounds x * (448 / amax) with amax = input_scale * 448; computing that factor
            # the same way keeps the FP8 rounding decisions identical to its fake quantization.
            inv = 448.0 / (input_scale.to(torch.float32) * 448.0)
            self.exact = _exact_gemm(weight, weight_scale, inv)
        if self.exact is not None:
            self.inv_scale = self.exact.inv
        elif input_scale is not None:
            # fp8(x * inv) / inv @ W^T == fp8(x * inv) @ (W / inv)^T: fold the dequant into W once.
            weight = weight * (1.0 / inv).to(weight.dtype)
            self.inv_scale = inv.to(weight.dtype)
            # Accumulate FP8 GEMMs in float64: a CPU GEMM's summation order depends on how many
            # rows it gets, and in float32 that noise flips FP8 input roundings downstream, so a
            # 1-token decode and a 17-token verification could disagree on near-tied logits. In
            # float64 the order-dependent error is ~1e-16: greedy speculative decoding stays exact.
            weight = weight.to(torch.float64)
        else:
            self.inv_scale = None
        if self.exact is None:
            self.weight_t = weight.t().contiguous()
            self.weight_rows = weight.contiguous() if weight.dtype == torch.float64 else None
        self.bias = bias
        self.plugin = None
        if fp8 is not None and self.inv_scale is not None:
            self.plugin = Fp8Gemm.create(fp8[0].to(weight.device), fp8[1], self.inv_scale, weight.dtype)

    @property
    def weight(self) -> torch.Tensor:
        """[out, in] view (the checkpoint's layout, input scale folded in)."""
        if self.nvfp4 is not None:
            return self.nvfp4.dequantized_weight().to(self.nvfp4_dtype)
        if self.exact is not None:
            return self.exact.dequantized()
        assert self.weight_t is not None
        return self.weight_t.t()

    @property
    def out_features(self) -> int:
        if self.nvfp4 is not None:
            return self.nvfp4.n
        if self.exact is not None:
            return self.exact.n
        assert self.weight_t is not None
        return self.weight_t.shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.nvfp4 is not None:
            out = self.nvfp4(x).to(x.dtype)  # exact sums: the same bits at every row count
        elif self.plugin is not None and x.numel() <= 16 * x.shape[-1]:  # decode-sized: the plugin op
            out = self.plugin(x, self.inv_scale)
        elif self.exact is not None:
            out = self.exact(x)
        else:
            assert self.weight_t is not None
            if self.inv_scale is not None:
                # fp8(x * inv) in the weight's float64; no-op casts skipped (each is a dispatcher call)
                q = (x * self.inv_scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(self.weight_t.dtype)
                out = q @ self.weight_t if self.weight_rows is None else gemm_by_rows(q, self.weight_t, self.weight_rows)
                if out.dtype != x.dtype:
                    out = out.to(x.dtype)
            elif self.weight_rows is not None and x.dtype == torch.float64:
                out = gemm_by_rows(x, self.weight_t, self.weight_rows)
            else:
                out = x @ self.weight_t
        if self.bias is not None:
            out += self.bias
        return out


def _exact_gemm(weight: torch.Tensor, weight_scale: torch.Tensor | None, inv: torch.Tensor
                ) -> fp8_exact.ExactFp8Gemm | None:
    """The integer FP8 GEMM for a CPU weight on the FP8 grid of `weight_scale`, else None."""
    if weight_scale is None or weight.device.type != "cpu" or not fp8_exact.available():
        return None
    if weight.shape[1] > fp8_exact.MAX_K:
        return None
    row_scale = _row_scales(weight_scale, weight.shape[0])
    grid = fp8_exact.grid_of(weight, row_scale)
    if grid is None:
        return None
    return fp8_exact.ExactFp8Gemm(grid, row_scale, inv)


def _row_scales(weight_scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor (one element) or per-row weight scale as float32 [rows]."""
    return weight_scale.to(torch.float32).reshape(-1).expand(rows)


def fuse_linears(parts: list[LinearParts]) -> list[Linear]:
    """One Linear over concatenated outputs when the parts share their input quantization.

    q/k/v (and gate/up) read the same input; ModelOpt's export gives them one input scale, so a
    single GEMM is exact. If the scales differ the parts stay separate.
    """
    parts = [LinearParts(*part) for part in parts]
    if any(part.nvfp4 is not None for part in parts):
        return [Linear(*part) for part in parts]  # each exact on its own (no fused NVFP4 GEMM here)
    scales = [part.input_scale for part in parts]
    same = all(s is None for s in scales) or (
        all(s is not None for s in scales) and all(torch.equal(scales[0], s) for s in scales))
    if not same:
        return [Linear(*part) for part in parts]
    weight = torch.cat([part.weight for part in parts], 0)
    biases = [part.bias for part in parts]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([part.bias if part.bias is not None else part.weight.new_zeros(part.weight.shape[0])
                          for part in parts])
    weight_scale = None
    if all(part.weight_scale is not None for part in parts):
        weight_scale = torch.cat([_row_scales(part.weight_scale, part.weight.shape[0]) for part in parts])  # type: ignore[arg-type]
    return [Linear(weight, bias, scales[0], weight_scale)]


def apply_linears(linears: list[Linear], x: torch.Tensor) -> torch.Tensor:
    if len(linears) == 1:
        return linears[0](x)
    return torch.cat([lin(x) for lin in linears], -1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Written out: F.rms_norm's CPU kernel goes through dtype round trips and costs ~5x more
    # per call on decode-sized rows; this is also transformers' LlamaRMSNorm formula, which
    # normalizes 16-bit inputs in float32 and rounds back before the weight (as here).
    if x.dtype in HALF_DTYPES:
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def interleave_rope_rows(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Reorders each head's output rows from HF's half-split layout to interleaved pairs.

    HF rotates dim i with dim i + head_dim/2. Interleaving makes each rotated pair adjacent so
    RoPE is one complex multiply. q and k get the same order, so q.k is unchanged.
    """
    half = head_dim // 2
    order = torch.stack([torch.arange(half), torch.arange(half) + half], 1).reshape(-1)
    w = weight.reshape(num_heads, head_dim, *weight.shape[1:])
    return w[:, order].reshape(weight.shape)


def rope_table(cfg: dict, head_dim: int, max_len: int) -> torch.Tensor:
    """Complex rotations [max_len, head_dim/2] for positions 0..max_len-1, from transformers' RoPE.

    Going through transformers' own rotary class covers every rope_type a Llama config may name
    (default, llama3, yarn, ...) including YaRN's attention scaling, folded into the magnitude.
    """
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta",
            "rope_scaling", "rope_parameters", "max_position_embeddings", "partial_rotary_factor")
    kwargs = {k: cfg[k] for k in keys if cfg.get(k) is not None}
    kwargs["head_dim"] = head_dim
    config = LlamaConfig(**kwargs)
    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(max_len).unsqueeze(0)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    half = head_dim // 2
    return torch.complex(cos[0, :, :half].double(), sin[0, :, :half].double()).to(torch.complex64)


def rope_table_llama4(cfg: dict, head_dim: int, max_len: int) -> torch.Tensor:
    """`rope_table` for a Llama 4 text config, from transformers' Llama4TextRotaryEmbedding (it builds
    the complex rotations itself, in float32, with torch.polar). Llama 4 checkpoints already hold q/k
    rows as interleaved pairs, the layout `apply_rope` rotates."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "rope_theta", "rope_scaling",
            "rope_parameters", "max_position_embeddings")
    kwargs = {k: cfg[k] for k in keys if cfg.get(k) is not None}
    config = Llama4TextConfig(**kwargs, head_dim=head_dim)
    rotary = Llama4TextRotaryEmbedding(config)
    return rotary(torch.zeros(1, dtype=torch.float32), torch.arange(max_len).unsqueeze(0))[0]


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama 4's qk-norm (Llama4TextL2Norm): RMS-normalise the last dim, no weight. 16-bit inputs
    go through float32 as there; float64 (the FP8-on-CPU compute) stays float64 like `rms_norm`."""
    if x.dtype in HALF_DTYPES:
        return l2_norm(x.float(), eps).to(x.dtype)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] (interleaved pairs) rotated by rot [T, D/2] (or [B, T, D/2]).

    16-bit inputs rotate in float32 (complex views exist for float32/float64 only; bf16 has none)
    and round back once, as transformers applies RoPE to a bf16 model's q/k in its own dtype after
    computing cos/sin in float32."""
    if x.dtype in HALF_DTYPES:
        return apply_rope(x.float(), rot).to(x.dtype)
    shape = x.shape
    z = torch.view_as_complex(x.reshape(*shape[:-1], shape[-1] // 2, 2))
    rot = rot[:, None, :] if rot.dim() == 2 else rot[:, :, None, :]
    return torch.view_as_real(z * rot).reshape(shape)


def prepare_mask(mask: torch.Tensor | None, heads: int, kv_heads: int, dtype: torch.dtype
                 ) -> torch.Tensor | None:
    """Once per forward: bool [T, S] -> additive float mask, repeated for grouped-query heads.

    SDPA converts a bool mask on every call; doing it once saves that in every layer.
    """
    if mask is None:
        return None
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    group = heads // kv_heads
    return additive.repeat(group, 1) if group > 1 else additive


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    """q [B, H, T, D]; k, v [B, KV, S, D]; mask from `prepare_mask` (or None: attend to all)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        # Grouped-query attention: fold each group's heads into the query length so K/V are
        # read once per KV head instead of being repeated.
        b, _, t, d = q.shape
        q = q.reshape(b, kv_heads, (heads // kv_heads) * t, d)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out.reshape(b, heads, t, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
