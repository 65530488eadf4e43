"""One `plan` line describing a mixture-of-experts Llama 4 target's layer structure, read from its
config (the tiny target's, a local directory's or a stand-in's), so the CPU rehearsal and the GPU
recipe it rehearses can be compared at a glance. Layer kinds follow transformers' Llama4TextConfig
defaults (moe_layers from interleave_moe_layer_step, no_rope_layers from no_rope_layer_interval,
chunked attention on the RoPE layers)."""

from __future__ import annotations

from typing import Any

from trtbuild.app.recipe import Recipe
from trtbuild.model.source import target_hf_config, text_config


def _layers(count: int, rule: str, indices: list[int]) -> str:
    shown = indices if len(indices) <= 6 else [*indices[:3], "...", *indices[-2:]]
    return f"{len(indices)} of {count} ({rule}: {', '.join(str(i) for i in shown)})"


def llama4_structure(text: dict[str, Any]) -> str | None:
    """'Llama 4 structure: ...' for a Llama 4 text config, else None."""
    if not str(text.get("model_type") or "").startswith("llama4"):
        return None
    layers = int(text.get("num_hidden_layers") or 0)
    step = int(text.get("interleave_moe_layer_step") or 1)
    moe = text.get("moe_layers")
    moe = list(moe) if moe is not None else list(range(step - 1, layers, step))
    interval = int(text.get("no_rope_layer_interval") or 4)
    no_rope = text.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    nope = [i for i in range(layers) if not no_rope[i]]
    chunk = text.get("attention_chunk_size")
    return (f"Llama 4 structure: MoE layers {_layers(layers, f'every {step}', moe)}, each "
            f"{text.get('num_local_experts')} routed experts (top-{text.get('num_experts_per_tok', 1)} sigmoid router, "
            f"width {text.get('intermediate_size')}) + a shared expert; dense layers width "
            f"{text.get('intermediate_size_mlp')}; NoPE layers {_layers(layers, f'every {interval}', nope)} with full "
            f"attention; RoPE layers attend in chunks of {chunk}; qk-norm {'on' if text.get('use_qk_norm') else 'off'}; "
            f"temperature tuning {'on' if text.get('attn_temperature_tuning', True) else 'off'}")


def structure_notes(recipe: Recipe) -> list[str]:
    model = recipe.model
    if model is None:
        return []
    if model.source == "tiny":
        config: dict[str, Any] | None = model.tiny.hf_config()
    else:
        found = target_hf_config(recipe)
        config = found[0] if found else None
    line = llama4_structure(text_config(config)) if config else None
    return [line] if line else []
