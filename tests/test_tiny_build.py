"""The embedded tiny target: a miniature config trained for a few steps, saved, reloaded, checked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from trtbuild.core.progress import Progress
from trtbuild.model.tiny import TinyModelConfig, build_tiny_model

# Small enough to build in seconds; still GQA (4 query heads, 2 kv heads) like the default.
MINI = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "seq_len": 64, "batch_size": 8, "steps": 12,
        "warmup_steps": 2, "processes": 1}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyModelConfig, Path, dict[str, float]]:
    cfg = TinyModelConfig(**MINI)
    out = tmp_path_factory.mktemp("tiny") / "hf"
    metrics = build_tiny_model(cfg, out, Progress())
    return cfg, out, metrics


def _tensors(directory: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def test_saved_directory_loads_offline(built, monkeypatch) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    cfg, out, _ = built
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    tok = AutoTokenizer.from_pretrained(out)
    model = LlamaForCausalLM.from_pretrained(out).eval()
    assert model.config.num_key_value_heads == cfg.num_key_value_heads < model.config.num_attention_heads
    assert model.config.hidden_size == cfg.hidden_size
    assert len(tok) == model.config.vocab_size == cfg.vocab_size
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>" and tok.pad_token is not None
    assert model.config.bos_token_id == tok.bos_token_id
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    ids = tok("def f(x):\n    return x", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id  # <s> is prepended like in training
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], cfg.vocab_size)
    assert torch.isfinite(logits).all()


def test_config_json_matches_the_recipe_view(built) -> None:
    """`hf_config()` (what `plan` reads without torch) agrees with the config.json written."""
    cfg, out, _ = built
    written = json.loads((out / "config.json").read_text())
    for key, value in cfg.hf_config().items():
        assert written[key] == value, key


def test_tokenizer_round_trips_text(built) -> None:
    from transformers import AutoTokenizer

    from trtbuild.core.data import pydoc_corpus

    _, out, _ = built
    tok = AutoTokenizer.from_pretrained(out)
    texts = list(pydoc_corpus.split()[1][:20]) + ["naïve café — 日本語 🙂\n\ttabs  and  spaces\n"]
    for text in texts:
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.decode(ids) == text


def test_metrics_beat_the_uniform_baseline(built) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    cfg, out, metrics = built
    assert set(metrics) >= {"heldout_perplexity", "train_perplexity", "train_seconds", "train_tokens",
                            "parameters"}
    uniform = len(AutoTokenizer.from_pretrained(out))  # perplexity of a model that knows nothing
    for name in ("heldout_perplexity", "train_perplexity"):
        assert math.isfinite(metrics[name]) and 1 < metrics[name] < uniform, (name, metrics[name])
    assert metrics["train_tokens"] == cfg.steps * cfg.batch_size * cfg.seq_len
    model = LlamaForCausalLM.from_pretrained(out)
    assert metrics["parameters"] == sum(p.numel() for p in model.parameters())
    assert metrics["train_seconds"] > 0


def test_heldout_perplexity_matches_an_independent_computation(built) -> None:
    """Recompute the documented method (bos + consecutive seq_len-1 token windows) with HF's own loss."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from trtbuild.core.data import pydoc_corpus

    cfg, out, metrics = built
    tok = AutoTokenizer.from_pretrained(out)
    model = LlamaForCausalLM.from_pretrained(out).eval()
    ids = tok(pydoc_corpus.heldout_text(), add_special_tokens=False).input_ids
    step = cfg.seq_len - 1
    nll, count = 0.0, 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of tiny forwards: extra threads only wait on each other
    with torch.no_grad():
        for start in range(0, len(ids), step):
            window = torch.tensor([[tok.bos_token_id] + ids[start:start + step]])
            loss = model(input_ids=window, labels=window).loss.item()  # mean over window-1 targets
            nll += loss * (window.shape[1] - 1)
            count += window.shape[1] - 1
    torch.set_num_threads(threads)
    assert metrics["heldout_perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)


def test_same_config_gives_identical_weights(built, tmp_path) -> None:
    import torch

    cfg, out, metrics = built
    again = tmp_path / "again"
    metrics2 = build_tiny_model(TinyModelConfig(**MINI), again, Progress())
    first, second = _tensors(out), _tensors(again)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    assert (out / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
    assert metrics2["heldout_perplexity"] == metrics["heldout_perplexity"]


def test_another_seed_gives_other_weights(built, tmp_path) -> None:
    import torch

    _, out, _ = built
    other = tmp_path / "other"
    build_tiny_model(TinyModelConfig(**{**MINI, "seed": 1}), other, Progress())
    first, second = _tensors(out), _tensors(other)
    assert not torch.equal(first["model.layers.0.self_attn.q_proj.weight"],
                           second["model.layers.0.self_attn.q_proj.weight"])


def test_failed_build_leaves_nothing(tmp_path, monkeypatch) -> None:
    import trtbuild.model.tiny as tiny

    def boom(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(tiny, "_train", boom)
    with pytest.raises(RuntimeError):
        build_tiny_model(TinyModelConfig(**MINI), tmp_path / "hf", Progress())
    assert list(tmp_path.iterdir()) == []


def test_refuses_a_non_empty_output_directory(tmp_path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        build_tiny_model(TinyModelConfig(**MINI), tmp_path / "hf", Progress())
    assert (tmp_path / "hf" / "keep.txt").read_text() == "x"


@pytest.mark.parametrize("bad", [
    {"hidden_size": 100, "num_attention_heads": 3},  # not a multiple
    {"num_attention_heads": 4, "num_key_value_heads": 3},  # GQA groups uneven
    {"seq_len": 4096, "max_position_embeddings": 2048},
    {"vocab_size": 100},  # below the byte alphabet
    {"hidden_size": 96, "num_attention_heads": 32},  # odd head_dim: RoPE needs pairs
    {"layers": 6},  # unknown key
])
def test_bad_configs_are_refused(bad) -> None:
    with pytest.raises(ValidationError):
        TinyModelConfig(**bad)


def test_every_field_is_described() -> None:
    for name, field in TinyModelConfig.model_fields.items():
        assert field.description, name
