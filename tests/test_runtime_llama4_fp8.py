"""The runtime on ModelOpt's FP8 export of a Llama 4 text target: experts FP8 (one per-tensor scale
per stacked parameter), routers unquantized, logits equal ModelOpt's fake-quantized model up to
rounding, and n-gram speculative decoding equals plain greedy decoding."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from runtime_fixtures import one_thread  # noqa: F401
from test_runtime_fp8 import quantize_and_export

from trtbuild.core.safetensors_header import read_header
from trtbuild.runtime import Generator, SpecParams, load_target
from trtbuild.runtime.devmodels import random_llama4

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama4fp8")
    # init 0.05: FP8 moves this model about as much as a trained one (see test_runtime_fp8)
    base = random_llama4(root / "fp32", init_range=0.05)
    ids = torch.randint(0, 256, (8, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fp32 = base(ids).logits
    fq_model, export = quantize_and_export(copy.deepcopy(base), root / "fp8", kv_cache=True)
    with torch.no_grad():
        fake_quant = fq_model(ids).logits
    export()
    return root / "fp8", ids, fp32, fake_quant


def test_export_quantizes_experts_and_not_routers(exported):
    path, *_ = exported
    header = read_header(path / "model.safetensors")
    dtypes = {name: entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    for layer in (1, 3):  # the MoE layers
        ff = f"model.layers.{layer}.feed_forward"
        assert dtypes[f"{ff}.experts.gate_up_proj"] == dtypes[f"{ff}.experts.down_proj"] == "F8_E4M3"
        assert dtypes[f"{ff}.shared_expert.down_proj.weight"] == "F8_E4M3"
        assert dtypes[f"{ff}.router.weight"] == "F32"
    excluded = json.loads((path / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert {"model.layers.1.feed_forward.router", "model.layers.3.feed_forward.router"} <= set(excluded)


def test_fp8_logits_match_modelopt_fake_quant(exported):
    path, ids, fp32, fake_quant = exported
    target = load_target(path)
    assert target.is_fp8 and target.dtype == torch.float64
    moe = target.layers[1].moe
    assert moe is not None and all(e.down.inv_scale is not None for e in moe.experts)
    ours = target.logits(ids)
    # As test_runtime_fp8: the same FP8 grid and scales, summed in another order, so rows agree to
    # rounding until an activation lands on the other side of an FP8 rounding boundary (then that
    # sequence drifts by about an FP8 step); no row moves as much as FP8 itself moves the logits.
    quant_effect = (fake_quant - fp32).abs().amax(-1)
    assert quant_effect.median() > 0.02
    gap = (ours - fake_quant).abs().amax(-1)
    assert gap.median() < 1e-5
    flipped = gap >= 1e-4
    assert (~flipped).float().mean() >= 0.9
    assert (gap < quant_effect).all()
    assert (ours.argmax(-1) == fake_quant.argmax(-1)).float().mean() >= 0.95


def test_fp8_ngram_speculative_equals_plain_greedy(exported):
    path, *_ = exported
    generator = Generator(load_target(path))
    spec = SpecParams(max_draft_len=3, method="ngram", max_matching_ngram_size=2)
    accepted = 0
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], list(range(12)) * 2):
        plain = generator.generate(prompt, 40, eos_token_ids=[]).tokens
        run = generator.generate(prompt, 40, spec=spec, eos_token_ids=[])
        assert run.tokens == plain
        accepted += sum(run.stats.accepted)
    assert accepted > 0
