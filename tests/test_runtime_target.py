"""The runtime's target model: logits and greedy KV-cache decoding equal transformers'."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from runtime_fixtures import one_thread  # noqa: F401

from trtbuild.core.errors import UserError
from trtbuild.runtime import Generator, SamplingParams, load_target
from trtbuild.runtime.devmodels import random_llama

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def random_target(tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    model = random_llama(path, layers=3, heads=4, kv_heads=2)  # grouped-query attention
    return path, model


def hf_greedy(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    with torch.no_grad():
        # an explicit mask: with only pad_token_id, generate() would mask out prompt tokens equal to it
        out = model.generate(prompt.view(1, -1), attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long),
                             max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.numel():].tolist()


def test_logits_match_transformers(random_target):
    path, model = random_target
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
    out = load_target(path).logits(ids)
    assert out.shape == ref.shape and out.dtype == torch.float32
    # fp32 sums in a different order (fused QKV, interleaved RoPE): differences are rounding only
    assert (out - ref).abs().max() < 1e-4 * ref.abs().max()


def test_greedy_kv_cache_equals_hf_generate(random_target):
    path, model = random_target
    target = load_target(path)
    generator = Generator(target)
    for seed in range(3):
        prompt = torch.randint(0, 256, (5 + 7 * seed,), generator=torch.Generator().manual_seed(seed))
        ref = hf_greedy(model, prompt, 40)
        ours = generator.generate(prompt, 40, eos_token_ids=[])
        assert ours.tokens == ref
        assert ours.stats.new_tokens == 40 and ours.stats.target_forwards == 40
    # the reference must not hinge on near-ties, or equality would be luck
    with torch.no_grad():
        top2 = model(torch.tensor([ref])).logits[0].topk(2).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3


def test_stream_yields_the_same_tokens_and_stops_at_eos(random_target):
    path, _ = random_target
    generator = Generator(load_target(path))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    full = generator.generate(prompt, 30, eos_token_ids=[]).tokens
    chunks = list(generator.stream(prompt, 30, eos_token_ids=[]))
    assert all(len(c) == 1 for c in chunks) and [t for c in chunks for t in c] == full
    eos = full[10]
    stopped = generator.generate(prompt, 30, eos_token_ids=[eos]).tokens
    assert stopped == full[: full.index(eos) + 1]


def test_sampling_is_seeded_and_follows_the_distribution(random_target):
    path, model = random_target
    generator = Generator(load_target(path))
    prompt = [7, 7, 7, 7]
    params = SamplingParams(temperature=1.5, seed=123)
    first = generator.generate(prompt, 12, sampling=params, eos_token_ids=[]).tokens
    assert generator.generate(prompt, 12, sampling=params, eos_token_ids=[]).tokens == first
    # the sampler's draws from the runtime's logits vs the reference model's softmax, binned as
    # top-3 + the rest (one batched call: 2000 independent rows)
    from trtbuild.runtime.sampling import Sampler

    with torch.no_grad():
        probs = (model(torch.tensor([prompt])).logits[0, -1] / 0.7).softmax(-1)
    logits = load_target(path).logits(torch.tensor([prompt]))[0, -1]
    draws = Sampler(SamplingParams(0.7, seed=0))(logits.expand(2000, -1))
    top = probs.topk(3).indices
    expected = torch.cat([probs[top], 1 - probs[top].sum(0, keepdim=True)])
    seen = torch.stack([(draws == t).float().mean() for t in top])
    seen = torch.cat([seen, 1 - seen.sum(0, keepdim=True)])
    assert expected[:3].sum() > 0.3  # the bins carry real mass
    assert 0.5 * (seen - expected).abs().sum() < 0.04  # sampling noise is ~0.015 with 2000 draws


def test_top_k_and_top_p_filters(random_target):
    from trtbuild.runtime.sampling import Sampler

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    probs = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=0)).probs(logits)
    ref = torch.zeros(5)
    ref[:2] = logits[0, :2].softmax(-1)
    assert torch.allclose(probs[0], ref)
    full = logits[0].softmax(-1)
    probs = Sampler(SamplingParams(temperature=1.0, top_p=float(full[0] + 0.01), seed=0)).probs(logits)
    ref = torch.zeros(5)
    ref[:2] = full[:2] / full[:2].sum()
    assert torch.allclose(probs[0], ref)


def test_refuses_other_architectures(random_target, tmp_path):
    path, _ = random_target
    other = tmp_path / "gpt2"
    shutil.copytree(path, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg["model_type"] = "gpt2"
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError) as err:
        load_target(other)
    message = str(err.value)
    assert "GPT2LMHeadModel" in message and "Llama" in message and "\n" not in message


def test_bad_directories_are_user_errors(random_target, tmp_path):
    path, _ = random_target
    with pytest.raises(UserError, match="no config.json"):
        load_target(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    from safetensors.torch import load_file, save_file

    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(UserError, match="model.layers.1.mlp.up_proj.weight"):
        load_target(broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["quantization_config"] = {"quant_algo": "W4A16_AWQ"}  # FP8 and NVFP4 are the ones it reads
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="W4A16_AWQ"):
        load_target(broken)


def test_prompt_longer_than_the_model_is_refused(random_target):
    path, _ = random_target
    generator = Generator(load_target(path))
    with pytest.raises(UserError, match="positions"):
        generator.generate(list(range(200)) * 2, 200)
