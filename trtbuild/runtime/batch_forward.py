"""Forward passes over a batch of sequences that each sit at their own position.

Sequence b's row i has a RoPE position, writes its K/V to one cache row of b's slot and attends
to the cache rows its mask row marks (`Layout`). Rows past a sequence's real tokens are padding:
they attend causally like real rows (never an all-masked row, so never NaN) and their outputs
are ignored. Nothing is shared across sequences: every op is row-wise except attention, which
reads only the sequence's own slot, and a masked key gets weight exactly 0. So a row's result is
the single-stream result up to summation-order noise, which the FP8 target's float64 compute
keeps ~1e-16 (see `load_target`), and greedy batched output equals single-stream output.

The layer arithmetic is the single-stream runtime's own (trtbuild.runtime.layers / target); only
K/V placement and masking differ, so the batched path adds no numerics of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtbuild.runtime.draft import DraftModel
from trtbuild.runtime.hf_config import LlamaSpec
from trtbuild.runtime.layers import apply_linears, apply_rope, attention, fake_quant_fp8, rms_norm
from trtbuild.runtime.target import DecoderLayer, TargetModel, mlp_block


@dataclass
class Layout:
    positions: torch.Tensor  # [B, T] RoPE positions
    cache_rows: torch.Tensor  # [B, T] where each row's K/V goes in its sequence's slot
    mask: torch.Tensor  # [B, T, S] bool: which cache rows [0, S) each row attends to

    @staticmethod
    def causal(starts: torch.Tensor, t: int, max_positions: int) -> Layout:
        """Rows at starts[b] .. starts[b]+t-1, each seeing its sequence's rows up to itself.

        Padding rows of a sequence near the context limit would run past the RoPE table;
        their positions are clamped (their outputs are ignored anyway)."""
        rows = starts.view(-1, 1) + torch.arange(t, device=starts.device)
        keys = torch.arange(int(rows.max()) + 1, device=starts.device)
        mask = keys.view(1, 1, -1) <= rows.unsqueeze(-1)
        return Layout(rows.clamp(max=max_positions - 1), rows, mask)

    @property
    def span(self) -> int:
        return self.mask.shape[-1]


def additive_mask(mask: torch.Tensor, heads: int, kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """Once per forward: bool [B, T, S] -> additive [B, 1, G*T, S], laid out for `attention`'s
    grouped-query folding (query row g*T + t is head g of the group at row t)."""
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    group = heads // kv_heads
    if group > 1:
        additive = additive.repeat(1, group, 1)
    return additive.unsqueeze(1)


def attention_rows(layer: DecoderLayer, x: torch.Tensor, spec: LlamaSpec, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, layout: Layout, rot: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Self-attention of x [B, T, in]; k_cache / v_cache [B, kv_heads, capacity, head_dim] are the
    batch's slots (views into the cache, written in place)."""
    b, t = x.shape[:2]
    nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qkv = apply_linears(layer.qkv, x)
    qk = apply_rope(qkv[..., : (nq + nkv) * d].view(b, t, nq + nkv, d), rot)
    q = qk[:, :, :nq].transpose(1, 2)
    k = qk[:, :, nq:]
    v = qkv[..., (nq + nkv) * d:].view(b, t, nkv, d)
    if layer.k_scale is not None:
        k = fake_quant_fp8(k, layer.k_scale)
    if layer.v_scale is not None:
        v = fake_quant_fp8(v, layer.v_scale)
    sequence = torch.arange(b, device=x.device).view(-1, 1)
    # Advanced indices on dims 0 and 2 address [B, T, kv_heads, head_dim]: row (b, i) -> slot b, row rows[b, i].
    k_cache[sequence, :, layout.cache_rows] = k
    v_cache[sequence, :, layout.cache_rows] = v
    s = layout.span
    out = attention(q, k_cache[:, :, :s], v_cache[:, :, :s], mask, d ** -0.5)
    return layer.o_proj(out.transpose(1, 2).reshape(b, t, nq * d))


def _last_rows(x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    if last is None:
        return x
    return x[torch.arange(x.shape[0], device=x.device), last].unsqueeze(1)


def target_rows(target: TargetModel, ids: torch.Tensor, kv: torch.Tensor, layout: Layout, *,
                aux_layers: tuple[int, ...] = (), last: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ids [B, T] through the target; kv: `BatchKV.view` of the batch's slots.

    Returns logits [B, T, V] (or [B, 1, V] at row last[b] of each sequence) and the aux hidden
    states [B, T, len(aux_layers) * hidden] of all rows (None without aux_layers)."""
    spec = target.spec
    rot = target.rot[layout.positions]
    mask = additive_mask(layout.mask, spec.num_heads, spec.num_kv_heads, target.dtype)
    x = F.embedding(ids, target.embed)
    aux: list[torch.Tensor] = []
    eps = spec.rms_norm_eps
    for i, layer in enumerate(target.layers):
        x = x + attention_rows(layer, rms_norm(x, layer.input_norm, eps), spec, kv[i, 0], kv[i, 1], layout,
                               rot, mask)
        x = x + mlp_block(layer, rms_norm(x, layer.post_norm, eps))
        if i in aux_layers:
            aux.append(x)
    logits = target.lm_head(rms_norm(_last_rows(x, last), target.norm, eps))
    return logits, (torch.cat(aux, -1) if aux else None)


def draft_rows(draft: DraftModel, hidden: torch.Tensor, next_ids: torch.Tensor, kv: torch.Tensor,
               layout: Layout, *, last: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The EAGLE-3 draft over a batch: hidden [B, T, h] and the next tokens' ids [B, T]
    -> (pre-norm outputs, draft logits), as `DraftModel.forward` computes them for one sequence."""
    spec = draft.spec
    rot = draft.rot[layout.positions]
    mask = additive_mask(layout.mask, spec.num_heads, spec.num_kv_heads, hidden.dtype)
    eps = spec.rms_norm_eps
    x = hidden
    for i, layer in enumerate(draft.layers):
        block = layer.block
        attn_in = draft.attention_input(layer, x, next_ids)
        x = x + attention_rows(block, attn_in, spec, kv[i, 0], kv[i, 1], layout, rot, mask)
        x = x + mlp_block(block, rms_norm(x, block.post_norm, eps))
    out = _last_rows(x, last)
    normed = out if draft.norm is None else rms_norm(out, draft.norm, eps)
    return out, draft.lm_head(normed)
