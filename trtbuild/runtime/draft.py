"""The EAGLE-3 draft model, read from the checkpoint ModelOpt's exporter writes.

Format (modelopt/torch/export/plugins/hf_spec_export.py, 0.47): config.json with
architectures [LlamaForCausalLMEagle3], draft_vocab_size and eagle_config; tensors fc.weight
[hidden, n_aux*hidden], one decoder layer under `layers.0.*` (older exporters: `midlayer.*`)
whose q/k/v read 2*hidden, layers.0.hidden_norm, norm.weight (use_last_layernorm), and optional
lm_head.weight [draft_vocab, hidden] and d2t (target_id = draft_id + d2t[draft_id]). Missing
lm_head/embeddings fall back to the target's, as in TRT-LLM.

The step, as ModelOpt trains it (plugins/modeling_eagle.py + LlamaDecoderLayer):
  h   = fc(cat(aux hidden states of the chosen target layers))   (real positions)
        or the previous draft step's pre-norm output                (drafted positions)
  e   = target embedding of the *next* token
  x   = cat(input_layernorm(e), hidden_norm(input_layernorm(h)))   # ModelOpt 0.47
        cat(input_layernorm(e), hidden_norm(h))                     # TRT-LLM / EAGLE reference
  h'  = h + o_proj(attn(x));  out = h' + mlp(post_attention_layernorm(h'))
  logits = lm_head(norm(out)); `out` (pre-norm) feeds the next step.
ModelOpt's decoder layer applies input_layernorm to h before its pre-attention hook adds
hidden_norm, so drafts trained with unmodified ModelOpt expect the doubled norm. `first_norm=
"standard"` (default) computes the TRT-LLM form, which is what TRT-LLM will run and what the
draft stage trains (trtbuild.draft.modelopt_compat patches 0.47's hook; ModelOpt 0.37's module
already computes this form); `"modelopt"` reproduces stock ModelOpt 0.47.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from trtbuild.core.errors import UserError
from trtbuild.runtime.checkpoint import Weights, load_state_dict
from trtbuild.runtime.hf_config import EAGLE3_ARCHITECTURES, LlamaSpec, read_json, spec_from_config
from trtbuild.runtime.kv_cache import KVCache
from trtbuild.runtime.layers import Linear, prepare_mask, rms_norm, rope_table
from trtbuild.runtime.target import (
    DecoderLayer,
    TargetModel,
    attention_block,
    causal_mask,
    load_decoder_layer,
    mlp_block,
)

FirstNorm = Literal["modelopt", "standard"]


@dataclass
class DraftLayer:
    block: DecoderLayer
    hidden_norm: torch.Tensor | None  # only the first layer (EAGLE-3's 2*hidden input)


class DraftModel:
    def __init__(self, spec: LlamaSpec, weights: Weights, target: TargetModel, source: Path,
                 first_norm: FirstNorm = "standard") -> None:
        cfg = spec.raw
        eagle = cfg.get("eagle_config") or {}
        h = spec.hidden_size
        config_file = str(source / "config.json")
        if h != target.spec.hidden_size:
            raise UserError(f"draft hidden_size {h} differs from the target's {target.spec.hidden_size}",
                            file=config_file, field="hidden_size")
        self.spec = spec
        self.target = target
        self.source = source
        self.first_norm = first_norm
        self.aux_layers = tuple(int(i) for i in eagle.get("eagle_aux_hidden_state_layer_ids") or ())
        bad = [i for i in self.aux_layers if not 0 <= i < target.spec.num_layers]
        if bad:
            raise UserError(f"eagle_aux_hidden_state_layer_ids {list(self.aux_layers)} name layers the "
                            f"{target.spec.num_layers}-layer target does not have", file=config_file,
                            field="eagle_config.eagle_aux_hidden_state_layer_ids")
        if not self.aux_layers or eagle.get("use_aux_hidden_state") is False:
            raise UserError("not an EAGLE-3 draft: it does not read aux hidden states", file=config_file,
                            field="eagle_config.use_aux_hidden_state")
        prefix = "layers" if weights.has("layers.0.self_attn.q_proj.weight") else "midlayer"
        if prefix == "midlayer" and not weights.has("midlayer.self_attn.q_proj.weight"):
            raise UserError("draft checkpoint has no decoder layer (layers.0.* or midlayer.*)",
                            file=str(source))
        self.fc = Linear(*weights.linear("fc", h, len(self.aux_layers) * h))
        self.layers: list[DraftLayer] = []
        for i in range(spec.num_layers):
            name = f"{prefix}.{i}" if prefix == "layers" else "midlayer"
            first = i == 0
            block = load_decoder_layer(weights, name, spec, 2 * h if first else h)
            norm = weights.float(f"{name}.hidden_norm.weight", (h,)) if first else None
            self.layers.append(DraftLayer(block, norm))
            if prefix == "midlayer":
                break
        self.norm = weights.float("norm.weight", (h,)) if weights.has("norm.weight") else None
        self.dtype = weights.dtype
        self.embed = (weights.float("embed_tokens.weight", (target.spec.vocab_size, h))
                      if weights.has("embed_tokens.weight") else target.embed.to(self.dtype))
        draft_vocab = int(cfg.get("draft_vocab_size") or target.spec.vocab_size)
        if weights.has("lm_head.weight"):
            self.lm_head = Linear(*weights.linear("lm_head", draft_vocab, h))
        else:
            if draft_vocab != target.spec.vocab_size:
                raise UserError("draft_vocab_size differs from the target's vocabulary but the draft "
                                "has no lm_head.weight", file=config_file, field="draft_vocab_size")
            # the target's head ([out, in] with any input scale folded in), in the draft's dtype
            self.lm_head = (target.lm_head if target.dtype == self.dtype
                            else Linear(target.lm_head.weight.to(self.dtype)))
        self.draft_vocab = draft_vocab
        # draft id -> target id, as one gather table
        to_target = torch.arange(draft_vocab, device=target.device)
        if weights.has("d2t"):
            d2t = weights.get("d2t", (draft_vocab,)).to(target.device, torch.long)
            to_target = to_target + d2t
        elif draft_vocab != target.spec.vocab_size:
            raise UserError("draft_vocab_size is smaller than the target vocabulary but there is no "
                            "d2t tensor", file=str(source), fix="export the draft with its d2t mapping")
        if int(to_target.min()) < 0 or int(to_target.max()) >= target.spec.vocab_size:
            raise UserError("d2t maps draft tokens outside the target vocabulary", file=str(source))
        self.to_target = to_target
        self.rot = rope_table(cfg, spec.head_dim, target.max_positions).to(target.device)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        s = self.spec
        return KVCache(len(self.layers), batch, s.num_kv_heads, capacity, s.head_dim,
                       self.dtype, self.target.device)

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated aux hidden states: the draft's input for real positions."""
        return self.fc(aux.to(self.dtype))

    def attention_input(self, layer: DraftLayer, x: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """A layer's attention input; the first layer's is cat(norm(embedding of the next tokens),
        hidden_norm(x)) (with ModelOpt's extra input norm on x for `first_norm="modelopt"`)."""
        eps = self.spec.rms_norm_eps
        norm = layer.block.input_norm
        if layer.hidden_norm is None:
            return rms_norm(x, norm, eps)
        emb = rms_norm(F.embedding(next_ids, self.embed), norm, eps)
        hid = rms_norm(x, norm, eps) if self.first_norm == "modelopt" else x
        return torch.cat([emb, rms_norm(hid, layer.hidden_norm, eps)], -1)

    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, cache: KVCache, start: int, *,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                logits_rows: slice | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, T, h] and the ids of the next tokens [B, T] -> (pre-norm out, draft logits)."""
        t = hidden.shape[1]
        rot = self.rot[start:start + t] if positions is None else self.rot[positions]
        if mask is None:
            mask = causal_mask(t, start, hidden.device)
        mask = prepare_mask(mask, self.spec.num_heads, self.spec.num_kv_heads, hidden.dtype)
        eps = self.spec.rms_norm_eps
        x = hidden
        for i, layer in enumerate(self.layers):
            block = layer.block
            attn_in = self.attention_input(layer, x, next_ids)
            x = x + attention_block(block, attn_in, self.spec, cache, i, start, rot, mask)
            x = x + mlp_block(block, rms_norm(x, block.post_norm, eps))
        out = x if logits_rows is None else x[:, logits_rows]
        normed = out if self.norm is None else rms_norm(out, self.norm, eps)
        return out, self.lm_head(normed)


def load_draft(path: Path, target: TargetModel, first_norm: FirstNorm = "standard") -> DraftModel:
    """Loads an EAGLE-3 draft checkpoint for `target` (shares its embeddings and device)."""
    path = Path(path)
    cfg_path = path / "config.json"
    cfg = read_json(cfg_path)
    archs = cfg.get("architectures") or []
    if not any(a in EAGLE3_ARCHITECTURES for a in archs):
        raise UserError(f"architectures {archs} is not an EAGLE-3 draft (LlamaForCausalLMEagle3)",
                        file=str(cfg_path), field="architectures")
    if cfg.get("vocab_size") not in (None, target.spec.vocab_size):
        raise UserError(f"draft vocab_size {cfg.get('vocab_size')} differs from the target's "
                        f"{target.spec.vocab_size}", file=str(cfg_path), field="vocab_size")
    spec = spec_from_config(cfg, path, file=str(cfg_path))
    # The draft only proposes; the target decides every token, so the draft need not share the
    # target's float64 (an FP8 target's exactness measure, see load_target): float32 halves its GEMMs.
    dtype = torch.float32 if target.dtype == torch.float64 else target.dtype
    weights = Weights(load_state_dict(path), path, dtype, target.device)
    with torch.inference_mode():
        return DraftModel(spec, weights, target, path, first_norm)
