"""The target model: a Llama decoder executed with plain torch ops on a preallocated KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from trtbuild.runtime.checkpoint import Weights, load_state_dict
from trtbuild.runtime.hf_config import LlamaSpec, QuantInfo, read_target_config
from trtbuild.runtime.kv_cache import KVCache
from trtbuild.runtime.layers import (
    FakeQuantFP8,
    Linear,
    apply_linears,
    apply_rope,
    attention,
    fuse_linears,
    interleave_rope_rows,
    prepare_mask,
    rms_norm,
    rope_table,
)


@dataclass
class DecoderLayer:
    """One Llama block with fused q|k|v and gate|up projections (q, k rows RoPE-interleaved)."""

    input_norm: torch.Tensor
    qkv: list[Linear]
    o_proj: Linear
    post_norm: torch.Tensor
    gate_up: list[Linear]
    down: Linear
    k_scale: torch.Tensor | None = None  # FP8 KV cache (ModelOpt k_proj.k_scale / v_proj.v_scale)
    v_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.k_quant = FakeQuantFP8(self.k_scale) if self.k_scale is not None else None
        self.v_quant = FakeQuantFP8(self.v_scale) if self.v_scale is not None else None


def load_decoder_layer(w: Weights, prefix: str, spec: LlamaSpec, in_features: int) -> DecoderLayer:
    h, d = spec.hidden_size, spec.head_dim
    nq, nkv = spec.num_heads, spec.num_kv_heads
    q = w.linear(f"{prefix}.self_attn.q_proj", nq * d, in_features)
    k = w.linear(f"{prefix}.self_attn.k_proj", nkv * d, in_features)
    v = w.linear(f"{prefix}.self_attn.v_proj", nkv * d, in_features)
    q = (interleave_rope_rows(q[0], nq, d),
         None if q[1] is None else interleave_rope_rows(q[1], nq, d), q[2])
    k = (interleave_rope_rows(k[0], nkv, d),
         None if k[1] is None else interleave_rope_rows(k[1], nkv, d), k[2])
    gate = w.linear(f"{prefix}.mlp.gate_proj", spec.intermediate_size, h)
    up = w.linear(f"{prefix}.mlp.up_proj", spec.intermediate_size, h)
    return DecoderLayer(
        input_norm=w.float(f"{prefix}.input_layernorm.weight", (h,)),
        qkv=fuse_linears([q, k, v]),
        o_proj=Linear(*w.linear(f"{prefix}.self_attn.o_proj", h, nq * d), fp8=w.fp8(f"{prefix}.self_attn.o_proj")),
        post_norm=w.float(f"{prefix}.post_attention_layernorm.weight", (h,)),
        gate_up=fuse_linears([gate, up]),
        down=Linear(*w.linear(f"{prefix}.mlp.down_proj", h, spec.intermediate_size),
                    fp8=w.fp8(f"{prefix}.mlp.down_proj")),
        k_scale=w.kv_scale(f"{prefix}.self_attn.k_proj.k_scale"),
        v_scale=w.kv_scale(f"{prefix}.self_attn.v_proj.v_scale"),
    )


def attention_block(layer: DecoderLayer, x: torch.Tensor, spec: LlamaSpec, cache: KVCache, index: int,
                    start: int, rot: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Self-attention of `x` [B, T, in] over cache rows [0, start) plus itself, writing its K/V."""
    b, t = x.shape[:2]
    nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qkv = apply_linears(layer.qkv, x)
    qk = apply_rope(qkv[..., : (nq + nkv) * d].view(b, t, nq + nkv, d), rot)
    q = qk[:, :, :nq].transpose(1, 2)
    k = qk[:, :, nq:].transpose(1, 2)
    v = qkv[..., (nq + nkv) * d:].view(b, t, nkv, d).transpose(1, 2)
    if layer.k_quant is not None:
        k = layer.k_quant(k)
    if layer.v_quant is not None:
        v = layer.v_quant(v)
    k_cache, v_cache = cache.layer(index)
    end = start + t
    k_cache[:, :, start:end] = k
    v_cache[:, :, start:end] = v
    out = attention(q, k_cache[:, :, :end], v_cache[:, :, :end], mask, d ** -0.5)
    return layer.o_proj(out.transpose(1, 2).reshape(b, t, nq * d))


def mlp_block(layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
    gate_up = apply_linears(layer.gate_up, x)
    gate, up = gate_up.chunk(2, -1)
    return layer.down(F.silu(gate) * up)


def causal_mask(t: int, start: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """[t, start+t] bool: row i sees cache rows < start+i+1. None for one token (sees all)."""
    if t == 1:
        return None
    return torch.ones(t, start + t, dtype=torch.bool, device=device).tril(start)


class TargetModel:
    """A loaded Llama checkpoint, unquantized or ModelOpt FP8, ready to run forward passes."""

    def __init__(self, spec: LlamaSpec, quant: QuantInfo, weights: Weights, source: Path,
                 device: str, max_positions: int | None = None) -> None:
        self.spec = spec
        self.quant = quant
        self.source = source
        self.device = torch.device(device)
        self.dtype = weights.dtype
        h = spec.hidden_size
        self.embed = weights.float("model.embed_tokens.weight", (spec.vocab_size, h))
        self.layers = [load_decoder_layer(weights, f"model.layers.{i}", spec, h)
                       for i in range(spec.num_layers)]
        self.norm = weights.float("model.norm.weight", (h,))
        if weights.has("lm_head.weight"):
            self.lm_head = Linear(*weights.linear("lm_head", spec.vocab_size, h))
        elif spec.tie_word_embeddings:
            self.lm_head = Linear(self.embed)  # (copies: the head wants [in, out])
        else:
            weights.get("lm_head.weight")  # raises the missing-tensor error
        limit = max_positions or int(spec.raw.get("max_position_embeddings") or 4096)
        self.rot = rope_table(spec.raw, spec.head_dim, limit).to(self.device)
        self.max_positions = limit

    # -- building blocks -------------------------------------------------------------------

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        if capacity > self.max_positions:
            raise ValueError(f"{capacity} positions exceed the model's {self.max_positions}")
        s = self.spec
        return KVCache(s.num_layers, batch, s.num_kv_heads, capacity, s.head_dim, self.dtype, self.device)

    def forward(self, ids: torch.Tensor, cache: KVCache, start: int, *,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                aux_layers: tuple[int, ...] = (), logits_rows: slice | torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Runs ids [B, T] whose K/V go to cache rows [start, start+T).

        positions: RoPE positions [T] (default start..start+T-1; a tree passes start+depth).
        mask: [T, start+T] bool, True = attend (default causal). aux_layers: decoder layers whose outputs are
        returned concatenated (EAGLE-3's aux hidden states). logits_rows: which rows get logits.
        """
        t = ids.shape[1]
        rot = self.rot[start:start + t] if positions is None else self.rot[positions]
        if mask is None:
            mask = causal_mask(t, start, self.device)
        mask = prepare_mask(mask, self.spec.num_heads, self.spec.num_kv_heads, self.dtype)
        x = F.embedding(ids, self.embed)
        aux: list[torch.Tensor] = []
        for i in range(len(self.layers)):
            x = self.layer_step(i, x, cache, start, rot, mask)
            if i in aux_layers:
                aux.append(x)
        if logits_rows is not None:
            x = x[:, logits_rows]
        return self.head(x), (torch.cat(aux, -1) if aux else None)

    def layer_step(self, index: int, x: torch.Tensor, cache: KVCache, start: int, rot: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
        """Decoder layer `index` on residual stream x [B, T, H]; mask as `prepare_mask` returns it."""
        layer, eps = self.layers[index], self.spec.rms_norm_eps
        x = x + attention_block(layer, rms_norm(x, layer.input_norm, eps), self.spec, cache, index, start, rot, mask)
        return x + mlp_block(layer, rms_norm(x, layer.post_norm, eps))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the last decoder layer's output x [..., H] (final norm, LM head)."""
        return self.lm_head(rms_norm(x, self.norm, self.spec.rms_norm_eps))

    @torch.inference_mode()
    def teacher_forced(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each decoder layer run on another model's input to it, and the head on its last output.

        states [L+1, B, T, H]: the embeddings, then every decoder layer's output, of a full causal
        forward of B sequences. Returns (outputs [L, B, T, H]: layer i on states[i], float32;
        logits [B, T, V] of the head on states[L]). Errors of one layer cannot feed the next, so
        a comparison sees each layer's own arithmetic (see trtbuild/export_check.py).
        """
        b, t = states.shape[1:3]
        cache = self.new_cache(b, t)
        mask = prepare_mask(causal_mask(t, 0, self.device), self.spec.num_heads, self.spec.num_kv_heads, self.dtype)
        rot = self.rot[:t]
        outputs = [self.layer_step(i, states[i].to(self.device, self.dtype), cache, 0, rot, mask).float().cpu()
                   for i in range(len(self.layers))]
        logits = self.head(states[-1].to(self.device, self.dtype)).float().cpu()
        return torch.stack(outputs), logits

    # -- public API ----------------------------------------------------------------------

    @torch.inference_mode()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full forward without a persistent cache: [B, T] token ids -> [B, T, V] float logits."""
        ids = input_ids.to(self.device, torch.long)
        cache = self.new_cache(ids.shape[0], ids.shape[1])
        return self.forward(ids, cache, 0)[0].float()

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def is_fp8(self) -> bool:
        return self.quant.quant_algo == "FP8"


def load_target(path: Path, device: str = "cpu", dtype: torch.dtype | None = None,
                max_positions: int | None = None) -> TargetModel:
    """Loads an HF Llama directory (unquantized, or ModelOpt's unified FP8 export).

    dtype: the compute dtype. By default float32, except an FP8 checkpoint on CPU computes in
    float64: FP8 rounds every linear's input, so float32 noise that depends on how many rows a
    kernel gets (SDPA, GEMM blocking) can flip a rounding and make a 1-token decode disagree with
    a 6-token verification on a near-tied logit. In float64 that noise is ~1e-16, far below any
    FP8 step, so greedy speculative output equals plain greedy output; the FP8 grid (the part of
    the numerics that matters) is unchanged. It costs speed: float64 GEMMs run at about half the
    float32 rate (bench/gemm_rows.py), which plain and speculative decoding pay alike.
    """
    path = Path(path)
    spec, quant = read_target_config(path)
    if dtype is None:
        dtype = torch.float64 if quant.quant_algo == "FP8" and torch.device(device).type == "cpu" else torch.float32
    weights = Weights(load_state_dict(path), path, dtype, device)
    with torch.inference_mode():
        model = TargetModel(spec, quant, weights, path, device, max_positions)
    return model
