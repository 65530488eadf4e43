"""Builders for the runtime tests: random and briefly trained Llamas, ModelOpt EAGLE-3 drafts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch


def eagle_module_model(target_dir: Path, *, draft_vocab: int, seed: int = 1, init_range: float = 0.2,
                       perturb_norms: float = 0.3) -> Any:
    """The target converted by ModelOpt into an EAGLE-3 model with a random (untrained) draft.

    A wide init and perturbed norm weights make every part of the draft matter numerically;
    d2t is a random injective draft->target map.
    """
    import modelopt.torch.speculative as mtsp
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    econf = copy.deepcopy(mtsp.config.EAGLE3_DEFAULT_CFG["config"])
    econf["eagle_architecture_config"].update(
        head_dim=head_dim, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, intermediate_size=cfg.intermediate_size,
        draft_vocab_size=draft_vocab, initializer_range=init_range)
    econf["eagle_use_torch_compile"] = False
    econf["eagle_export_rope_scaling"] = {}  # keep the trained RoPE (see test_runtime_draft)
    torch.manual_seed(seed)
    mtsp.convert(model, [("eagle", econf)])
    with torch.no_grad():
        for name, param in model.eagle_module.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * perturb_norms)
        if draft_vocab < cfg.vocab_size:
            keep = torch.randperm(cfg.vocab_size)[:draft_vocab].sort().values
            model.eagle_module.d2t.copy_(keep - torch.arange(draft_vocab))
    return model.eval()


def export_draft(model: Any, out_dir: Path) -> Path:
    from modelopt.torch.export.unified_export_hf import export_speculative_decoding

    export_speculative_decoding(model, export_dir=out_dir)
    return out_dir


@pytest.fixture(scope="module", autouse=False)
def one_thread():
    """Tiny models run fastest on one thread, and on a shared CPU a second OpenMP thread that
    gets descheduled stalls every op at its barrier (10x slower here under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
