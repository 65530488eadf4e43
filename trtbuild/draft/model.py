"""The target converted by ModelOpt (`modelopt.torch.speculative`, eagle mode) into an EAGLE-3 model.

The draft copies the target's attention geometry (heads, KV heads, head_dim), RoPE and norm eps,
so TRT-LLM can keep its KV in the target's cache, and starts from the target's final norm and the
target's lm_head rows of the draft vocabulary (a much better start than random for a small budget).

Training computes what TRT-LLM's `Eagle3DecoderLayer` runs, `cat(input_layernorm(embeds),
hidden_norm(hidden))`, with either ModelOpt release (0.47 needs its first-layer hook replaced, 0.37
already computes it): what differs between the releases lives in `modelopt_compat`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trtbuild.draft import modelopt_compat
from trtbuild.draft.data import load_target

__all__ = ["DraftArch", "convert_to_eagle3", "draft_parameters", "eagle_mode_config", "load_target"]


@dataclass
class DraftArch:
    aux_layers: list[int]
    draft_vocab_size: int
    intermediate_size: int | None = None  # None: the target's
    ttt_steps: int = 3
    loss_decay: float = 0.9
    offline: bool = False  # the target's hidden states come from a dump (trtbuild/draft/hidden.py)


def _rope(text_config: Any) -> tuple[float, dict[str, Any]]:
    """(theta, rope_scaling dict) of the target, from transformers-5 `rope_parameters` or legacy keys."""
    params = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None) or {}
    params = dict(params)
    theta = params.get("rope_theta") or getattr(text_config, "rope_theta", None) or 10000.0
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    scaling["rope_theta"] = theta
    return float(theta), scaling


def eagle_mode_config(target: nn.Module, arch: DraftArch) -> dict[str, Any]:
    """ModelOpt's EagleConfig for this target: EAGLE-3 defaults with the target's geometry."""
    from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG

    text = target.config.get_text_config()
    theta, scaling = _rope(text)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    config = copy.deepcopy(EAGLE3_DEFAULT_CFG["config"])
    config["eagle_architecture_config"].update({
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads or text.num_attention_heads,
        "head_dim": head_dim,
        "intermediate_size": arch.intermediate_size or text.intermediate_size,
        "rms_norm_eps": text.rms_norm_eps,
        "hidden_act": getattr(text, "hidden_act", "silu"),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "draft_vocab_size": arch.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(arch.aux_layers),
        "torch_dtype": "float32",  # CPU training; the export casts
        "bos_token_id": text.bos_token_id,
        "eos_token_id": text.eos_token_id,
        "pad_token_id": getattr(text, "pad_token_id", None),
        # 0.47 copies these three from the target itself; 0.37 needs them here
        "hidden_size": text.hidden_size,
        "vocab_size": text.vocab_size,
        "max_position_embeddings": text.max_position_embeddings,
    })
    config.update({
        "eagle_ttt_steps": arch.ttt_steps,
        "eagle_loss_decay_factor": arch.loss_decay,
        "eagle_use_torch_compile": False,  # compile time dominates short CPU runs
        "eagle_export_rope_scaling": {},  # keep the target's RoPE in the export, no YaRN injection
        "eagle_freeze_base_model": True,
        "eagle_self_logit_distillation": True,
        "eagle_offline": arch.offline,
    })
    return modelopt_compat.mode_config(config)


def convert_to_eagle3(target: nn.Module, arch: DraftArch, d2t: torch.Tensor | None) -> nn.Module:
    """Convert `target` in place with `mtsp.convert` and initialise the draft; returns the model."""
    import modelopt.torch.speculative as mtsp

    mtsp.convert(target, [("eagle", eagle_mode_config(target, arch))])
    module = target.eagle_module
    modelopt_compat.match_trtllm_first_layer(module)
    head = modelopt_compat.draft_head(module)
    with torch.no_grad():
        lm_head = target.get_output_embeddings().weight
        if hasattr(module, "d2t"):
            assert d2t is not None and d2t.shape == module.d2t.shape
            module.d2t.copy_(d2t)
            rows = torch.arange(len(d2t)) + d2t
            head.weight.copy_(lm_head[rows])
        elif head is not None:
            head.weight.copy_(lm_head)
        final_norm = getattr(target.get_decoder(), "norm", None)
        if hasattr(module, "norm") and final_norm is not None:
            module.norm.weight.copy_(final_norm.weight)
    return target


def draft_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.eagle_module.parameters() if p.requires_grad]
