"""transformers' SDPA attention, without repeating grouped K/V when a mask is passed.

transformers' `sdpa` hands grouped-query K/V to torch's scaled_dot_product_attention as they are
(`enable_gqa`) only without an attention mask; with one (left-padded batched generation: the draft's
answers and requests) it first repeats K and V to every query head. On CPU that copy made attention
~70 % of the answers' generation time at 256 tokens (SmolLM2: 9 query heads on 3 K/V heads). torch's
SDPA takes the grouped K/V with a mask too, with the same result (bench/draft_generation.py checks the
tokens). Every other case goes to transformers' own function.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "trtbuild_sdpa_gqa"


def sdpa_gqa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = key.shape[1] != query.shape[1]
    if attention_mask is None or not grouped or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # with a mask, transformers' own function is not causal either (the mask says it all)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def attention_implementation() -> str:
    """Registers the function (and transformers' SDPA mask for it) once; the name to load models with."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
