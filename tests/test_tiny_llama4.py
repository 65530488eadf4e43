"""The embedded tiny target as a Llama 4 text model (model.tiny.llama4): a miniature trained for a
few steps with two processes, saved, reloaded by transformers as Llama4ForCausalLM, deterministic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from trtbuild.core.progress import Progress
from trtbuild.model.tiny import TinyModelConfig, build_tiny_model

# 4 layers: MoE on 1 and 3, NoPE on 3; chunk 16 and floor 16 inside the 64-token windows.
MINI = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "vocab_size": 512, "seq_len": 64, "batch_size": 8, "steps": 12,
        "warmup_steps": 2, "processes": 2,
        "llama4": {"intermediate_size_mlp": 128, "attention_chunk_size": 16, "floor_scale": 16}}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyModelConfig, Path, dict[str, float]]:
    cfg = TinyModelConfig(**MINI)
    out = tmp_path_factory.mktemp("tiny4") / "hf"
    return cfg, out, build_tiny_model(cfg, out, Progress())


def test_loads_as_llama4_with_maverick_structure(built) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Llama4ForCausalLM

    cfg, out, metrics = built
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert isinstance(model, Llama4ForCausalLM)
    c = model.config
    assert c.moe_layers == [1, 3] and c.no_rope_layers == [1, 1, 1, 0]
    assert c.layer_types == ["chunked_attention"] * 3 + ["full_attention"]
    assert (c.num_local_experts, c.num_experts_per_tok, c.attention_chunk_size) == (4, 1, 16)
    assert c.use_qk_norm is False and c.attn_temperature_tuning is True
    layer = model.model.layers[1].feed_forward
    assert layer.experts.gate_up_proj.shape == (4, 64, 128) and layer.shared_expert.down_proj.in_features == 64
    assert model.model.layers[0].feed_forward.down_proj.in_features == 128  # dense: intermediate_size_mlp
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("def f(x):\n    return x", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
    assert 1 < metrics["heldout_perplexity"] < cfg.vocab_size  # beats a uniform guess after 12 steps
    assert metrics["parameters"] == sum(p.numel() for p in model.parameters())


def test_config_json_matches_the_recipe_view(built) -> None:
    cfg, out, _ = built
    written = json.loads((out / "config.json").read_text())
    for key, value in cfg.hf_config().items():
        assert written[key] == value, key
    assert written["rope_theta"] == cfg.rope_theta  # top level, as TensorRT-LLM's transformers 4.57 reads it


def test_runtime_matches_transformers_on_the_trained_model(built) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from trtbuild.runtime import load_target

    _, out, _ = built
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(3, 512, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        exact = model.double()(ids).logits
    noise = (ref.double() - exact).abs().max().item()
    assert (load_target(out).logits(ids) - ref).abs().max().item() <= 4 * noise + 1e-6


def test_same_config_gives_identical_weights(built, tmp_path) -> None:
    from safetensors.torch import load_file

    cfg, out, metrics = built
    again = build_tiny_model(cfg, tmp_path / "again", Progress())
    first, second = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "again" / "model.safetensors"))
    assert first.keys() == second.keys()
    assert all(first[k].equal(second[k]) for k in first)
    assert math.isclose(again["heldout_perplexity"], metrics["heldout_perplexity"], rel_tol=0, abs_tol=0)


@pytest.mark.parametrize("bad", [
    {"llama4": {"num_experts_per_tok": 5}},  # more than the 4 experts
    {"llama4": {"attention_chunk_size": 0}},
    {"llama4": {"unknown": 1}},
])
def test_bad_llama4_configs_are_refused(bad) -> None:
    with pytest.raises(ValidationError):
        TinyModelConfig(**bad)
