"""Forward passes over a batch of sequences that each sit at their own position.

Sequence b's row i has a RoPE position, writes its K/V to one cache row of b's slot and attends
to the cache rows its mask row marks (`Layout`). Rows past a sequence's real tokens are padding:
they attend causally like real rows (never an all-masked row, so never NaN) and their outputs
are ignored. Nothing is shared across sequences: every op is row-wise except attention, which
reads only the sequence's own slot, and a masked key gets weight exactly 0. So a row's result is
the single-stream result up to summation-order noise, which the FP8 target's compute keeps at
~1e-16 or removes (exact FP8 GEMMs, float64 argmax logits; see `load_target`), and greedy
batched output equals single-stream output.

The layer arithmetic is the single-stream runtime's own (trtbuild.runtime.layers / target); only
K/V placement and masking differ, so the batched path adds no numerics of its own.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtbuild.runtime.draft import DraftModel
from trtbuild.runtime.hf_config import LlamaSpec
from trtbuild.runtime.layers import apply_linears, attention, fake_quant_fp8, rms_norm
from trtbuild.runtime.target import DecoderLayer, TargetModel, mlp_block, position_qk


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

    def chunked(self, chunk: int) -> torch.Tensor:
        """`mask` narrowed to keys in each row's own chunk of positions (Llama 4's chunked attention,
        transformers' chunked_overlay). A cache row holds the position its row index names, except
        the rows this step writes, which hold `positions`."""
        b, s = self.mask.shape[0], self.span
        keys = torch.arange(s, device=self.mask.device).expand(b, s).clone()
        keys.scatter_(1, self.cache_rows.clamp(max=s - 1), self.positions)
        return self.mask & ((keys.unsqueeze(1) // chunk) == (self.positions.unsqueeze(-1) // chunk))


def additive_mask(mask: torch.Tensor, heads: int, kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """Once per forward: bool [B, T, S] -> additive [B, 1, G*T, S], laid out for `attention`'s
    grouped-query folding (query row g*T + t is head g of the group at row t)."""
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    group = heads // kv_heads
    if group > 1:
        additive = additive.repeat(1, group, 1)
    return additive.unsqueeze(1)


def attend(qkv: torch.Tensor, spec: LlamaSpec, layer: DecoderLayer, k_cache: torch.Tensor, v_cache: torch.Tensor,
           layout: Layout, rot: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Self-attention of the q/k/v projections qkv [B, T, (heads + 2 kv_heads) * head_dim] -> [B, T,
    heads * head_dim] (before o_proj); k_cache / v_cache [B, kv_heads, capacity, head_dim] are the
    batch's slots (views into the cache, written in place)."""
    b, t = qkv.shape[:2]
    nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qk = position_qk(layer, qkv[..., : (nq + nkv) * d].view(b, t, nq + nkv, d), rot, layout.positions, nq)
    q = qk[:, :, :nq].transpose(1, 2)
    k = qk[:, :, nq:]
    v = qkv[..., (nq + nkv) * d:].view(b, t, nkv, d)
    if layer.k_scale is not None:
        k = fake_quant_fp8(k, layer.k_scale)
    if layer.v_scale is not None:
        v = fake_quant_fp8(v, layer.v_scale)
    sequence = torch.arange(b, device=qkv.device).view(-1, 1)
    # Advanced indices on dims 0 and 2 address [B, T, kv_heads, head_dim]: row (b, i) -> slot b, row rows[b, i].
    k_cache[sequence, :, layout.cache_rows] = k
    v_cache[sequence, :, layout.cache_rows] = v
    s = layout.span
    out = attention(q, k_cache[:, :, :s], v_cache[:, :, :s], mask, d ** -0.5)
    return out.transpose(1, 2).reshape(b, t, nq * d)


def attention_rows(layer: DecoderLayer, x: torch.Tensor, spec: LlamaSpec, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, layout: Layout, rot: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Self-attention block of x [B, T, in], o_proj included (see `attend`)."""
    return layer.o_proj(attend(apply_linears(layer.qkv, x), spec, layer, k_cache, v_cache, layout, rot, mask))


def _last_rows(x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    if last is None:
        return x
    return x[torch.arange(x.shape[0], device=x.device), last].unsqueeze(1)


@dataclass
class RowGroup:
    """Sequences that enter one target forward with one layout: ids [B, T] over the cache slots kv
    (a `BatchKV.view`); logits at every row, or only at row last[b] of each sequence."""

    ids: torch.Tensor
    kv: torch.Tensor
    layout: Layout
    last: torch.Tensor | None = None


def target_rows(target: TargetModel, ids: torch.Tensor, kv: torch.Tensor, layout: Layout, *,
                aux_layers: tuple[int, ...] = (), last: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ids [B, T] through the target; kv: `BatchKV.view` of the batch's slots.

    Returns logits [B, T, V] (or [B, 1, V] at row last[b] of each sequence) and the aux hidden
    states [B, T, len(aux_layers) * hidden] of all rows (None without aux_layers)."""
    return target_groups(target, [RowGroup(ids, kv, layout, last)], aux_layers=aux_layers)[0]


def target_groups(target: TargetModel, groups: Seq[RowGroup], *, aux_layers: tuple[int, ...] = (),
                  ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Several groups through the target in one forward, (logits, aux) per group as `target_rows`.

    The groups' rows are stacked for every row-wise op (the GEMMs, norms, MLP) and split only for
    attention, which each group does over its own slots with its own layout: a step's
    verification rows (a few per sequence) and a new request's prompt rows (many) share the GEMMs
    without padding one to the other's width, as TensorRT-LLM batches context and generation
    requests together."""
    spec = target.spec
    eps = spec.rms_norm_eps
    sizes = [g.ids.numel() for g in groups]
    shapes = [tuple(g.ids.shape) for g in groups]
    rots = [target.rot[g.layout.positions] for g in groups]
    masks = [additive_mask(g.layout.mask, spec.num_heads, spec.num_kv_heads, target.dtype) for g in groups]
    l4 = spec.llama4
    chunked = masks
    if l4 is not None and l4.attention_chunk_size and any(l4.chunked):
        chunked = [additive_mask(g.layout.chunked(l4.attention_chunk_size), spec.num_heads, spec.num_kv_heads,
                                 target.dtype) for g in groups]
    x = F.embedding(torch.cat([g.ids.reshape(-1) for g in groups]), target.embed)  # [rows, hidden]
    aux: list[torch.Tensor] = []
    for i, layer in enumerate(target.layers):
        qkv = apply_linears(layer.qkv, rms_norm(x, layer.input_norm, eps))
        layer_masks = chunked if layer.chunked else masks
        parts = [attend(part.view(*shape, -1), spec, layer, g.kv[i, 0], g.kv[i, 1], g.layout, rot, mask)
                 .reshape(n, -1) for part, shape, n, g, rot, mask
                 in zip(qkv.split(sizes), shapes, sizes, groups, rots, layer_masks, strict=True)]
        x = x + layer.o_proj(parts[0] if len(parts) == 1 else torch.cat(parts))
        x = x + mlp_block(layer, rms_norm(x, layer.post_norm, eps))
        if i in aux_layers:
            aux.append(x)
    hidden = [_last_rows(part.view(*shape, -1), g.last) for part, shape, g in zip(x.split(sizes), shapes, groups,
                                                                                   strict=True)]
    rows = [h.shape[0] * h.shape[1] for h in hidden]
    flat = torch.cat([h.reshape(n, -1) for h, n in zip(hidden, rows, strict=True)])
    logits = target.lm_head(rms_norm(flat, target.norm, eps)).split(rows)
    stacked = torch.cat(aux, -1).split(sizes) if aux else [None] * len(groups)
    return [(lg.view(h.shape[0], h.shape[1], -1), None if a is None else a.view(*shape, -1))
            for lg, h, a, shape in zip(logits, hidden, stacked, shapes, strict=True)]


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
