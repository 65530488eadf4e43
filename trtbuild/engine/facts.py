"""The target's architecture facts that parallelism and length limits depend on.

Read from a config.json without loading weights: the tiny target's config comes from the recipe
(`model.tiny`), a local or cached Hub model's from its file. Multimodal configs (Llama 4) keep
the language model's numbers under `text_config`; MoE models name their expert count
differently per family, so several keys are tried.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.model.config import ModelConfig

# Per-family names of the routed expert count.
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class ModelFacts:
    source: str  # where the facts came from, for messages
    model_type: str | None
    num_hidden_layers: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    num_experts: int  # 0 for a dense model
    max_position_embeddings: int | None
    rope_scaling: bool
    hidden_size: int | None


def facts_from_config(cfg: dict[str, Any], source: str) -> ModelFacts:
    text: dict[str, Any] = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg

    def get_int(*keys: str) -> int | None:
        for key in keys:
            value = text.get(key, cfg.get(key))
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    heads = get_int("num_attention_heads")
    return ModelFacts(
        source=source,
        model_type=text.get("model_type") or cfg.get("model_type"),
        num_hidden_layers=get_int("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=get_int("num_key_value_heads") or heads,
        num_experts=get_int(*_EXPERT_KEYS) or 0,
        max_position_embeddings=get_int("max_position_embeddings"),
        rope_scaling=bool(text.get("rope_scaling") or cfg.get("rope_scaling")),
        hidden_size=get_int("hidden_size"),
    )


def facts_from_dir(directory: Path) -> ModelFacts | None:
    path = directory / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return facts_from_config(cfg, str(path)) if isinstance(cfg, dict) else None


def target_facts(recipe: RecipeInfo) -> ModelFacts | None:
    """Facts of the recipe's target, or None when they cannot be known before a build."""
    model = recipe.section(ModelConfig)
    if model is None:
        return None
    if model.source == "tiny":  # the tiny target's HF config, from the recipe's `model.tiny` (no torch)
        return facts_from_config(model.tiny.hf_config(), "model.tiny")
    if model.source in ("path", "hub"):
        found = recipe.target_hf_config()  # the real config.json, else the recipe's stand-in
        return facts_from_config(*found) if found else None
    return None
