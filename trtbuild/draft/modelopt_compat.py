"""Everything in the draft stage's `source: train` path that differs between the ModelOpt releases it
trains with, in one place: nvidia-modelopt 0.47 (the default .venv, transformers 5) and 0.37 (the
TensorRT-LLM 1.1 container's, transformers 4.57.1). Both yield the same checkpoint and train the same
computation; the release is told apart by its features, not its version string.

Facts read from the installed 0.37.0 package (modelopt/torch/...):
- speculative/config.py `EagleConfig`: no `eagle_ttt_steps`, `eagle_use_torch_compile`,
  `eagle_export_rope_scaling`, `eagle_decoder_type`; opt/config.py `ModeloptBaseConfig` forbids extra
  keys (pydantic `extra="forbid"`), so `mode_config` drops them.
- speculative/plugins/transformers.py `HFEagleModel.forward`: always unrolls 4 draft passes
  (training-time test), returns `train_acc` as a flat tuple of 4 floats and sums the 4 losses
  unweighted (`eagle_loss_decay_factor` is stored by `modify` but never read). `modify` raises unless
  the architecture config's `hidden_size` is the target's (0.47 copies hidden_size, vocab_size and
  max_position_embeddings from the target itself: plugins/hf_eagle.py).
- same file, `EagleModule`: the first layer's `input_layernorm` is `nn.Identity`, the embeddings are
  normalised by `input_embeds_norm` and the attention pre-hook concatenates
  `cat(input_embeds_norm(embeds), hidden_norm(fc(aux)))` with the residual `fc(aux)`: already what
  TRT-LLM's Eagle3DecoderLayer computes, so nothing is patched. The draft head is `eagle_lm_head`
  (only when the draft vocabulary is smaller, as 0.47's `lm_head`).
- export/plugins/hf_spec_export.py `EAGLE_MODELOPT_TO_OFFICIAL`: its state-dict -> `midlayer.*` map;
  0.37 has no `export_speculative_decoding` (its draft export runs inside the whole unified HF
  export), so the draft is written here from that map and 0.47's config template below.

Facts read from the installed 0.47.0 package: speculative/plugins/modeling_eagle.py (the first layer
keeps `input_layernorm` and owns `hidden_norm`, which ModelOpt's hook applies on top: patched here),
export/plugins/hf_spec_configs.py `llama_eagle_template_config` (copied as `DRAFT_CONFIG_TEMPLATE`;
tests/test_draft_export.py checks the two stay equal), speculative/eagle/default_config.py
(`parallel_draft_heads_num_layers: 1`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

LEGACY_TTT_STEPS = 4  # 0.37: HFEagleModel.forward's fixed unroll

# 0.47's `llama_eagle_template_config`: the keys (and constants) of the draft's config.json. None =
# taken from the draft's architecture config, else from the target's config (0.47's rule too).
DRAFT_CONFIG_TEMPLATE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": None, "eos_token_id": None,
    "hidden_act": None, "hidden_size": None, "initializer_range": None, "intermediate_size": None,
    "max_position_embeddings": None, "model_type": "llama", "num_attention_heads": None,
    "num_key_value_heads": None, "num_hidden_layers": None, "pad_token_id": None, "rms_norm_eps": None,
    "tie_word_embeddings": False, "torch_dtype": None, "transformers_version": None, "use_cache": True,
    "vocab_size": None, "draft_vocab_size": None, "rope_scaling": None, "attention_bias": None,
    "attention_dropout": None, "head_dim": None, "mlp_bias": None, "pretraining_tp": None, "rope_theta": None,
    "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": None, "use_aux_hidden_state": None,
        "use_input_layernorm_in_first_layer": None, "use_last_layernorm": None, "use_mtp_layernorm": None,
        "next_layer_regular": True, "parallel_draft_step": None, "parallel_draft_heads_num_layers": None,
    },
}
# 0.47 defaults of architecture keys 0.37's default config lacks (written into the config as 0.47 does).
_047_ARCH_DEFAULTS = {"parallel_draft_heads_num_layers": 1}


def _eagle_config_fields() -> set[str]:
    from modelopt.torch.speculative.config import EagleConfig

    return set(EagleConfig.model_fields)


def is_legacy() -> bool:
    """True for the 0.37 layout (no configurable training-time test)."""
    return "eagle_ttt_steps" not in _eagle_config_fields()


def offline_base_layers() -> int:
    """Decoder layers the head-only target keeps for offline training: 0.47 drops them all itself
    (`eagle_offline`), 0.37's `modify` places the draft on the device of `model.layers[-1]` (never run:
    its forward takes `base_model_outputs` instead), so one stays there."""
    return 1 if is_legacy() else 0


def mode_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` without the keys the installed EagleConfig lacks (0.37 rejects unknown keys)."""
    fields = _eagle_config_fields()
    return {k: v for k, v in config.items() if k in fields}


def effective_ttt_steps(requested: int) -> int:
    """The number of draft passes training unrolls with the installed release."""
    return LEGACY_TTT_STEPS if is_legacy() else requested


def ignored_settings(ttt_steps: int, loss_decay: float) -> list[str]:
    """Draft settings the installed release cannot honour, one line each (empty with 0.47)."""
    if not is_legacy():
        return []
    notes = []
    if ttt_steps != LEGACY_TTT_STEPS:
        notes.append(f"draft.ttt_steps {ttt_steps}: ModelOpt 0.37 always unrolls {LEGACY_TTT_STEPS} passes")
    if loss_decay != 1.0:
        notes.append(f"draft.loss_decay {loss_decay}: ModelOpt 0.37 weights every pass's loss equally")
    return notes


def step_accuracy(train_acc: Any) -> list[float]:
    """Per-pass top-1 agreement: 0.47 returns [[a0, a1, ...]], 0.37 (a0, a1, a2, a3)."""
    first = train_acc[0]
    values = first if isinstance(first, list | tuple) else train_acc
    return [float(a) for a in values]


def draft_head(eagle_module: nn.Module) -> nn.Linear | None:
    """The draft's own lm_head (0.47 `lm_head`, 0.37 `eagle_lm_head`), None when it uses the target's."""
    return getattr(eagle_module, "lm_head", None) or getattr(eagle_module, "eagle_lm_head", None)


def match_trtllm_first_layer(eagle_module: nn.Module) -> None:
    """Make the first layer compute cat(input_layernorm(embeds), hidden_norm(hidden)), as TRT-LLM does."""
    layer = eagle_module.layers[0]
    if not hasattr(layer, "hidden_norm"):  # 0.37: already that computation; check the parts it relies on
        if not (isinstance(layer.input_layernorm, nn.Identity) and hasattr(eagle_module, "input_embeds_norm")
                and hasattr(eagle_module, "hidden_norm")):
            raise RuntimeError("unknown ModelOpt EAGLE-3 module layout (neither 0.47's nor 0.37's)")
        return
    # 0.47 normalises the hidden input twice (input_layernorm, then hidden_norm in ModelOpt's hook):
    # replace the hook so training computes what TRT-LLM (and trtbuild's runtime) will run.
    attention = layer.self_attn
    attention._forward_pre_hooks.clear()  # ModelOpt's concat hook (the only one registered there)
    attention._forward_pre_hooks_with_kwargs.clear()

    def stash_raw_hidden(module: nn.Module, args: tuple, kwargs: dict) -> None:
        eagle_module._raw_hidden = args[0] if args else kwargs["hidden_states"]

    def concat(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        embeds = layer.input_layernorm(eagle_module._input_embeds)
        hidden = layer.hidden_norm(eagle_module._raw_hidden)
        eagle_module._input_embeds = None
        eagle_module._raw_hidden = None
        kwargs["hidden_states"] = torch.cat((embeds, hidden), dim=-1)
        return args, kwargs

    layer.register_forward_pre_hook(stash_raw_hidden, with_kwargs=True)
    attention.register_forward_pre_hook(concat, with_kwargs=True)


def export_raw(model: nn.Module, raw_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The draft's tensors in 0.47's export naming (`layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`) and
    its config.json (0.47's template), from whichever release is installed."""
    try:
        from modelopt.torch.export import export_speculative_decoding
    except ImportError:  # 0.37
        return _legacy_tensors(model), _legacy_config(model)
    from safetensors.torch import load_file

    export_speculative_decoding(model, export_dir=raw_dir)
    return (load_file(str(Path(raw_dir) / "model.safetensors")),
            json.loads((Path(raw_dir) / "config.json").read_text()))


def _legacy_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    from modelopt.torch.export.plugins.hf_spec_export import EAGLE_MODELOPT_TO_OFFICIAL

    names = {**EAGLE_MODELOPT_TO_OFFICIAL["required"], **EAGLE_MODELOPT_TO_OFFICIAL["optional"]}
    state = model.eagle_module.state_dict()
    unknown = sorted(set(state) - set(names))
    if unknown:
        raise RuntimeError(f"ModelOpt EAGLE-3 module has tensors the export map lacks: {unknown}")
    # 0.37's official names say midlayer.*; 0.47's export says layers.0.* (export.py names the layer).
    tensors = {names[k].replace("midlayer.", "layers.0.", 1): v.detach().clone() for k, v in state.items()}
    tensors.setdefault("lm_head.weight", model.get_output_embeddings().weight.detach().clone())
    return tensors


def _legacy_config(model: nn.Module) -> dict[str, Any]:
    def lookup(key: str) -> Any:
        for source in (model.eagle_config, model.config):
            value = getattr(source, key, None)
            if value is not None:
                return str(value).replace("torch.", "") if isinstance(value, torch.dtype) else value
        return _047_ARCH_DEFAULTS.get(key)

    config = copy.deepcopy(DRAFT_CONFIG_TEMPLATE)
    for key, value in config.items():
        if isinstance(value, dict):
            for sub in value:
                if value[sub] is None:
                    value[sub] = lookup(sub)
        elif value is None:
            config[key] = lookup(key)
    return config
