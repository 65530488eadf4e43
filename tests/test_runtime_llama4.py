"""The runtime on a Llama 4 text target (MoE with a shared expert, NoPE layers with temperature
tuning, chunked attention): logits equal transformers' Llama4ForCausalLM, greedy decoding equals
its generate(), n-gram speculative and in-flight batched decoding equal plain greedy decoding."""

from __future__ import annotations

import copy

import pytest
import torch
from runtime_fixtures import one_thread  # noqa: F401
from test_runtime_batch import run
from test_runtime_target import hf_greedy

from trtbuild.runtime import Generator, SpecParams, load_target
from trtbuild.runtime.batch import BatchDecoder
from trtbuild.runtime.devmodels import random_llama4

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ = 40  # > chunk 8: five chunks; positions past floor_scale 4 scale the NoPE queries


@pytest.fixture(scope="module", params=[(1, False), (2, True)], ids=["top1", "top2-qknorm"])
def pair(request, tmp_path_factory):
    """(HF model, runtime target): Maverick's top-1 routing without qk-norm, and Scout's qk-norm
    with top-2 routing so the sum over chosen experts is exercised too."""
    top_k, qk_norm = request.param
    path = tmp_path_factory.mktemp("llama4")
    model = random_llama4(path, top_k=top_k, qk_norm=qk_norm)
    return model, load_target(path)


def ids(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def float32_noise(model, tokens: torch.Tensor) -> float:
    """How far transformers' own float32 forward is from the same weights in float64: the rounding
    any float32 implementation may differ by."""
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(tokens).logits
        return (model(tokens).logits.double() - exact).abs().max().item()


def test_logits_match_transformers_within_float32_rounding(pair):
    model, target = pair
    tokens = ids()
    with torch.no_grad():
        ref = model(tokens).logits
    out = target.logits(tokens)
    assert out.shape == ref.shape and out.dtype == torch.float32
    noise = float32_noise(model, tokens)
    # Measured here: runtime error and float32 noise both ~1e-5 on logits of magnitude ~6; 4x the
    # reference's own float32 error leaves room for another summation order, nothing more.
    assert (out - ref).abs().max().item() <= 4 * noise + 1e-6


@pytest.mark.parametrize("ablate", ["chunking", "temperature", "routing", "rope"])
def test_each_llama4_feature_changes_the_logits(pair, ablate):
    """The comparison above would catch each feature done wrong: turning one off moves the logits
    by far more than the tolerance."""
    model, target = pair
    tokens = ids()
    with torch.no_grad():
        ref = model(tokens).logits
    noise = float32_noise(model, tokens)
    broken = copy.copy(target)
    broken.layers = [copy.copy(layer) for layer in target.layers]
    for layer in broken.layers:
        if ablate == "chunking":
            layer.chunked = False
        elif ablate == "temperature":
            layer.temperature = None
        elif ablate == "rope":
            layer.use_rope = not layer.use_rope
        elif layer.moe is not None:
            layer.moe = copy.copy(layer.moe)
            layer.moe.experts = layer.moe.experts[1:] + layer.moe.experts[:1]  # every token to another expert
    assert (broken.logits(tokens) - ref).abs().max().item() > 100 * (4 * noise + 1e-6)


def test_greedy_kv_cache_decoding_equals_hf_generate(pair):
    model, target = pair
    generator = Generator(target)
    for seed in range(2):
        prompt = torch.randint(0, 256, (3 + 11 * seed,), generator=torch.Generator().manual_seed(seed))
        ref = hf_greedy(model, prompt, 30)  # crosses chunk boundaries while decoding
        assert generator.generate(prompt, 30, eos_token_ids=[]).tokens == ref


def test_ngram_speculative_decoding_equals_plain_greedy(pair):
    _, target = pair
    generator = Generator(target)
    spec = SpecParams(max_draft_len=3, method="ngram", max_matching_ngram_size=2)
    accepted = 0
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], list(range(12)) * 2):
        plain = generator.generate(prompt, 40, eos_token_ids=[]).tokens
        run_ = generator.generate(prompt, 40, spec=spec, eos_token_ids=[])
        assert run_.tokens == plain
        accepted += sum(run_.stats.accepted)
    assert accepted > 0  # verification of several tokens at once was exercised


def test_batched_decoding_equals_single_stream(pair):
    _, target = pair
    generator = Generator(target)
    prompts = [[1, 2, 3], [7, 7, 0, 5, 4, 9, 9, 9, 9, 1], [4], list(range(20))]
    jobs = [dict(prompt=p, max_new_tokens=24, eos_token_ids=[]) for p in prompts]
    got = run(BatchDecoder(target, 4, prefill_tokens=16), {0: jobs[:2], 3: jobs[2:]})
    for tokens, prompt in zip(got.values(), prompts, strict=True):
        assert tokens == generator.generate(prompt, 24, eos_token_ids=[]).tokens


def test_the_engine_bundles_wrapped_form_gives_the_same_logits(pair, tmp_path):
    """The engine stage rewrites a text-only target as Llama4ForConditionalGeneration (text_config,
    `language_model.` tensor names); the runtime reads it back to the very same model."""
    import shutil

    from trtbuild.core.safetensors_header import read_header
    from trtbuild.engine.llama4_wrap import wrap_target

    model, target = pair
    wrapped = tmp_path / "wrapped"
    model.save_pretrained(wrapped)
    originals = {f.name: f.read_bytes() for f in wrapped.glob("*.safetensors")}
    assert wrap_target(wrapped, "Llama4ForConditionalGeneration")
    for name, before in originals.items():  # tensor bytes unchanged, only names
        header = read_header(wrapped / name)
        assert all(k.startswith("language_model.") for k in header) and header
        assert (wrapped / name).read_bytes().endswith(before[-1024:])
    tokens = ids()
    assert torch.equal(load_target(wrapped).logits(tokens), target.logits(tokens))
    shutil.rmtree(wrapped)


def test_refuses_vision_tensors_in_the_wrapped_form(tmp_path):
    from trtbuild.core.errors import UserError
    from trtbuild.runtime.target import unwrapped_state

    text = {"language_model.model.norm.weight": torch.ones(2)}
    assert list(unwrapped_state(text, tmp_path)) == ["model.norm.weight"]
    with pytest.raises(UserError) as info:
        unwrapped_state({**text, "vision_model.patch_embedding.linear.weight": torch.ones(2)}, tmp_path)
    assert "vision_model.patch_embedding" in info.value.one_line()


def test_refuses_the_multimodal_wrapper_and_an_inconsistent_config(tmp_path):
    import json
    import shutil

    from trtbuild.core.errors import UserError

    random_llama4(tmp_path / "ok")
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    wrapper = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4"}
    for name, change, field in [
        ("wrapper", wrapper, "text_config"),
        ("vision", {**wrapper, "text_config": config, "vision_config": {"hidden_size": 8}}, "vision_config"),
        ("nochunk", {"attention_chunk_size": None}, "attention_chunk_size"),
        ("layertype", {"layer_types": ["sliding_attention"] * 4}, "layer_types"),
    ]:
        shutil.copytree(tmp_path / "ok", tmp_path / name)
        (tmp_path / name / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UserError) as info:
            load_target(tmp_path / name)
        assert info.value.field == field and str(tmp_path / name) in info.value.one_line()
