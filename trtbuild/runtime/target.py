"""The target model: a Llama (or Llama 4 text) decoder executed with plain torch ops on a preallocated
KV cache.

Llama 4 layers differ as transformers' modeling_llama4 defines them: an MoE feed-forward on
`moe_layers` (trtbuild.runtime.moe), NoPE layers (no RoPE, full attention, queries scaled by the
temperature-tuning factor), chunked attention on RoPE layers (a query sees keys of its own
`attention_chunk_size` chunk of positions only) and optional qk-norm after RoPE."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from trtbuild.core.errors import UserError
from trtbuild.runtime.checkpoint import Weights, load_state_dict
from trtbuild.runtime.hf_config import WRAPPED_PREFIX, LlamaSpec, QuantInfo, read_target_config
from trtbuild.runtime.kv_cache import KVCache
from trtbuild.runtime.layers import (
    FakeQuantFP8,
    Linear,
    LinearParts,
    apply_linears,
    apply_rope,
    attention,
    fuse_linears,
    interleave_rope_rows,
    l2_norm,
    prepare_mask,
    rms_norm,
    rope_table,
    rope_table_llama4,
)
from trtbuild.runtime.lm_head import RefinedHead
from trtbuild.runtime.moe import MoE, load_moe


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
    # Llama 4 (defaults: a Llama layer).
    use_rope: bool = True
    chunked: bool = False  # attention within chunks (the mask `forward` passes for chunked layers)
    qk_norm_eps: float | None = None  # L2 qk-norm after RoPE
    temperature: tuple[float, float] | None = None  # NoPE query scaling: (floor_scale, attn_scale)
    moe: MoE | None = None  # replaces gate_up / down

    def __post_init__(self) -> None:
        self.k_quant = FakeQuantFP8(self.k_scale) if self.k_scale is not None else None
        self.v_quant = FakeQuantFP8(self.v_scale) if self.v_scale is not None else None


def load_decoder_layer(w: Weights, prefix: str, spec: LlamaSpec, in_features: int,
                       index: int = 0) -> DecoderLayer:
    """Layer `index` of the stack at `prefix` (the index picks a Llama 4 layer's kind)."""
    h, d = spec.hidden_size, spec.head_dim
    nq, nkv = spec.num_heads, spec.num_kv_heads
    q = w.linear(f"{prefix}.self_attn.q_proj", nq * d, in_features)
    k = w.linear(f"{prefix}.self_attn.k_proj", nkv * d, in_features)
    v = w.linear(f"{prefix}.self_attn.v_proj", nkv * d, in_features)
    if spec.llama4 is not None:
        return _llama4_layer(w, prefix, spec, index, [q, k, v])
    q, k = _rope_interleaved(q, nq, d), _rope_interleaved(k, nkv, d)
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


def _rope_interleaved(parts: LinearParts, heads: int, head_dim: int) -> LinearParts:
    """q or k projection rows in `interleave_rope_rows` order (bias and per-row scales with them)."""
    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or t.numel() == 1 else interleave_rope_rows(t, heads, head_dim)

    nvfp4 = parts.nvfp4.with_rows(lambda t: interleave_rope_rows(t, heads, head_dim)) if parts.nvfp4 else None
    return parts._replace(weight=interleave_rope_rows(parts.weight, heads, head_dim), bias=rows(parts.bias),
                          weight_scale=rows(parts.weight_scale), nvfp4=nvfp4)


def _llama4_layer(w: Weights, prefix: str, spec: LlamaSpec, index: int,
                  qkv: list[LinearParts]) -> DecoderLayer:
    """A Llama4TextDecoderLayer: q/k rows are already interleaved pairs (its apply_rotary_emb rotates
    adjacent dims), the feed-forward is `feed_forward.*`, dense or MoE."""
    l4 = spec.llama4
    assert l4 is not None
    h, d, nq = spec.hidden_size, spec.head_dim, spec.num_heads
    ff = f"{prefix}.feed_forward"
    moe = None
    if index in l4.moe_layers:
        moe = load_moe(w, ff, h, spec.intermediate_size, l4.num_experts, l4.top_k)
        gate_up: list[Linear] = []
        down = None
    else:
        gate = w.linear(f"{ff}.gate_proj", l4.intermediate_size_mlp, h)
        up = w.linear(f"{ff}.up_proj", l4.intermediate_size_mlp, h)
        gate_up = fuse_linears([gate, up])
        down = Linear(*w.linear(f"{ff}.down_proj", h, l4.intermediate_size_mlp), fp8=w.fp8(f"{ff}.down_proj"))
    use_rope = l4.use_rope[index]
    return DecoderLayer(
        input_norm=w.float(f"{prefix}.input_layernorm.weight", (h,)),
        qkv=fuse_linears(qkv),
        o_proj=Linear(*w.linear(f"{prefix}.self_attn.o_proj", h, nq * d), fp8=w.fp8(f"{prefix}.self_attn.o_proj")),
        post_norm=w.float(f"{prefix}.post_attention_layernorm.weight", (h,)),
        gate_up=gate_up,
        down=down,  # type: ignore[arg-type]  # None only beside an MoE
        k_scale=w.kv_scale(f"{prefix}.self_attn.k_proj.k_scale"),
        v_scale=w.kv_scale(f"{prefix}.self_attn.v_proj.v_scale"),
        use_rope=use_rope,
        chunked=l4.chunked[index],
        qk_norm_eps=spec.rms_norm_eps if l4.use_qk_norm and use_rope else None,
        temperature=(l4.floor_scale, l4.attn_scale) if l4.attn_temperature_tuning and not use_rope else None,
        moe=moe,
    )


def position_qk(layer: DecoderLayer, qk: torch.Tensor, rot: torch.Tensor, positions: torch.Tensor | None,
                num_heads: int) -> torch.Tensor:
    """q|k heads [B, T, heads + kv_heads, D] as attention reads them: RoPE, then (Llama 4) qk-norm on
    RoPE layers or the temperature scaling of NoPE layers' queries at `positions` ([T] or [B, T])."""
    if layer.use_rope:
        qk = apply_rope(qk, rot)
    if layer.qk_norm_eps is not None:
        qk = l2_norm(qk, layer.qk_norm_eps)
    if layer.temperature is not None:
        assert positions is not None, "a NoPE layer with temperature tuning needs the positions"
        floor_scale, attn_scale = layer.temperature
        # As Llama4TextAttention: log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1, in float32.
        scale = torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
        scale = scale.to(qk.dtype).view(*((1,) if positions.dim() == 1 else ()), *positions.shape, 1, 1)
        q = qk[:, :, :num_heads] * scale
        qk = torch.cat([q, qk[:, :, num_heads:]], 2)
    return qk


def attention_block(layer: DecoderLayer, x: torch.Tensor, spec: LlamaSpec, cache: KVCache, index: int,
                    start: int, rot: torch.Tensor, mask: torch.Tensor | None,
                    positions: torch.Tensor | None = None) -> torch.Tensor:
    """Self-attention of `x` [B, T, in] over cache rows [0, start) plus itself, writing its K/V.
    positions [T]: the rows' positions (needed by Llama 4's NoPE temperature tuning)."""
    b, t = x.shape[:2]
    nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qkv = apply_linears(layer.qkv, x)
    qk = position_qk(layer, qkv[..., : (nq + nkv) * d].view(b, t, nq + nkv, d), rot, positions, nq)
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
    if layer.moe is not None:
        return layer.moe(x)
    gate_up = apply_linears(layer.gate_up, x)
    gate, up = gate_up.chunk(2, -1)
    return layer.down(F.silu(gate) * up)


def causal_mask(t: int, start: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """[t, start+t] bool: row i sees cache rows < start+i+1. None for one token (sees all)."""
    if t == 1:
        return None
    return torch.ones(t, start + t, dtype=torch.bool, device=device).tril(start)


def chunk_mask(mask: torch.Tensor | None, positions: torch.Tensor, start: int, chunk: int) -> torch.Tensor:
    """`mask` [T, start+T] (None: all) narrowed to keys in the query's own chunk of positions, as
    transformers' chunked_overlay: key position // chunk == query position // chunk. Cache rows
    below `start` hold positions 0..start-1; the new rows hold `positions`."""
    keys = torch.cat([torch.arange(start, device=positions.device), positions])
    same = (keys.view(1, -1) // chunk) == (positions.view(-1, 1) // chunk)
    return same if mask is None else mask & same


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
        self.layers = [load_decoder_layer(weights, f"model.layers.{i}", spec, h, i)
                       for i in range(spec.num_layers)]
        self.norm = weights.float("model.norm.weight", (h,))
        if weights.has("lm_head.weight"):
            head = weights.linear("lm_head", spec.vocab_size, h)
        elif spec.tie_word_embeddings:
            head = LinearParts(self.embed, None, None)
        else:
            weights.get("lm_head.weight")  # raises the missing-tensor error
        self.lm_head: Linear | RefinedHead
        if self.dtype == torch.float64 and head.input_scale is None and head.bias is None:
            self.lm_head = RefinedHead(head.weight)  # float32 GEMM, float64 where the argmax is decided
        else:
            self.lm_head = Linear(*head)  # (copies: the head wants [in, out])
        limit = max_positions or int(spec.raw.get("max_position_embeddings") or 4096)
        table = rope_table_llama4 if spec.llama4 is not None else rope_table
        self.rot = table(spec.raw, spec.head_dim, limit).to(self.device)
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
        if positions is None:
            positions = torch.arange(start, start + t, device=self.device)
        rot = self.rot[positions]
        if mask is None:
            mask = causal_mask(t, start, self.device)
        masks = self.layer_masks(mask, positions, start)
        x = F.embedding(ids, self.embed)
        aux: list[torch.Tensor] = []
        for i in range(len(self.layers)):
            x = self.layer_step(i, x, cache, start, rot, masks, positions)
            if i in aux_layers:
                aux.append(x)
        if logits_rows is not None:
            x = x[:, logits_rows]
        return self.head(x), (torch.cat(aux, -1) if aux else None)

    def layer_masks(self, mask: torch.Tensor, positions: torch.Tensor, start: int
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(full mask, chunked mask or None) as `prepare_mask` returns them, from the bool mask; the
        chunked one is for Llama 4's chunked-attention layers."""
        l4 = self.spec.llama4
        chunked = None
        if l4 is not None and l4.attention_chunk_size and any(l4.chunked):
            chunked = prepare_mask(chunk_mask(mask, positions, start, l4.attention_chunk_size),
                                   self.spec.num_heads, self.spec.num_kv_heads, self.dtype)
        return prepare_mask(mask, self.spec.num_heads, self.spec.num_kv_heads, self.dtype), chunked

    def layer_step(self, index: int, x: torch.Tensor, cache: KVCache, start: int, rot: torch.Tensor,
                   masks: tuple[torch.Tensor, torch.Tensor | None], positions: torch.Tensor) -> torch.Tensor:
        """Decoder layer `index` on residual stream x [B, T, H]; masks as `layer_masks` returns them."""
        layer, eps = self.layers[index], self.spec.rms_norm_eps
        mask = masks[1] if layer.chunked else masks[0]
        x = x + attention_block(layer, rms_norm(x, layer.input_norm, eps), self.spec, cache, index, start, rot,
                                mask, positions)
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
        a comparison sees each layer's own arithmetic (see trtbuild/quantize/export_check.py).
        """
        b, t = states.shape[1:3]
        cache = self.new_cache(b, t)
        positions = torch.arange(t, device=self.device)
        masks = self.layer_masks(causal_mask(t, 0, self.device), positions, 0)
        rot = self.rot[:t]
        outputs = [self.layer_step(i, states[i].to(self.device, self.dtype), cache, 0, rot, masks, positions
                                   ).float().cpu()
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


def unwrapped_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Tensor names of the wrapped Llama 4 form (`language_model.model.*`) as the text model's
    (`model.*`); a checkpoint with vision tensors is refused (text-only runtime)."""
    if not any(name.startswith(WRAPPED_PREFIX) for name in state):
        return state
    other = sorted(name for name in state if not name.startswith(WRAPPED_PREFIX))
    if other:
        raise UserError(f"checkpoint has tensors outside {WRAPPED_PREFIX!r} (e.g. {other[0]!r}); the trtbuild "
                        "runtime serves text-only Llama 4", file=str(path),
                        fix="serve the multimodal model through TensorRT-LLM")
    return {name[len(WRAPPED_PREFIX):]: tensor for name, tensor in state.items()}


def load_target(path: Path, device: str = "cpu", dtype: torch.dtype | None = None,
                max_positions: int | None = None) -> TargetModel:
    """Loads an HF Llama or Llama 4 text directory (unquantized, or ModelOpt's unified FP8 or NVFP4
    export; NVFP4 linears run trtbuild.runtime.nvfp4's exact W4A4 linear and compute in float64 on
    CPU for the same reason as FP8).

    dtype: the compute dtype. By default float32, except an FP8 checkpoint on CPU computes in
    float64: FP8 rounds every linear's input, so float32 noise that depends on how many rows a
    kernel gets (SDPA, GEMM blocking) can flip a rounding and make a 1-token decode disagree with
    a 6-token verification on a near-tied logit. In float64 that noise is ~1e-16, far below any
    FP8 step, so greedy speculative output equals plain greedy output; the FP8 grid (the part of
    the numerics that matters) is unchanged. The FP8 GEMMs themselves are exact integer dot
    products (trtbuild.runtime.fp8_exact, int8 planes: 3 bytes a weight instead of float64's 8),
    and the LM head runs in float32 with float64 values wherever a logit can be its row's argmax
    (trtbuild.runtime.lm_head): the speed of smaller operands, the greedy choices of float64.
    """
    path = Path(path)
    spec, quant = read_target_config(path)
    if dtype is None:
        quantized = quant.quant_algo in ("FP8", "NVFP4")  # both round every linear's input
        dtype = torch.float64 if quantized and torch.device(device).type == "cpu" else torch.float32
    weights = Weights(unwrapped_state(load_state_dict(path), path), path, dtype, device)
    with torch.inference_mode():
        model = TargetModel(spec, quant, weights, path, device, max_positions)
    return model
