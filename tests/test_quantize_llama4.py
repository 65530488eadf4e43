"""The quantize stage on a Llama 4 text target (MoE, shared expert, NoPE, chunked attention), run
for real: ModelOpt FP8 quantizes the stacked experts and the shared expert, leaves the routers out
(as TensorRT-LLM builds them: contract llama4_model.unquantized_modules), the gate measures the
perplexity ratio, and the export check (the runtime on the exported FP8 experts vs ModelOpt's fake
quantization) passes, and fails when an expert scale is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_quantize_stage import SMALL, run_stage, runtime_trace

from trtbuild.core.contract import load_contract
from trtbuild.core.errors import BuildError
from trtbuild.quantize.export_check import check_export


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quantize_fixtures import make_tokenizer
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    from trtbuild.core.data import sources

    root = tmp_path_factory.mktemp("llama4")
    torch.manual_seed(0)
    tokenizer = make_tokenizer()
    config = Llama4TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=64, intermediate_size_mlp=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=False, attention_chunk_size=16,
        floor_scale=16, max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    model = Llama4ForCausalLM(config)
    texts = list(sources.load_texts(sources.TextSource.model_validate("pydoc"), "train"))
    data = sources.token_windows(tokenizer, texts[:800], n=25 * 8, seq_len=64, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(25):
        batch = data[step * 8:(step + 1) * 8]
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval().save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    return root


@pytest.fixture(scope="module")
def run(model_root: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("quant") / "out"
    return run_stage(model_root, out, SMALL), out


def test_experts_quantized_routers_excluded_as_tensorrt_llm_builds_them(run) -> None:
    result, out = run
    state = load_file(out / "hf" / "model.safetensors")
    for layer in (1, 3):
        ff = f"model.layers.{layer}.feed_forward"
        assert state[f"{ff}.experts.gate_up_proj"].dtype == torch.float8_e4m3fn
        assert state[f"{ff}.experts.down_proj"].dtype == torch.float8_e4m3fn
        assert state[f"{ff}.shared_expert.gate_proj.weight"].dtype == torch.float8_e4m3fn
        assert state[f"{ff}.router.weight"].dtype == torch.float32
    excluded = json.loads((out / "hf" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    routers = {m for m in excluded if m.endswith(".router")}
    assert routers == {"model.layers.1.feed_forward.router", "model.layers.3.feed_forward.router"}
    for version in ("1.1.0", "1.2.1"):
        assert load_contract(version).section("llama4_model")["unquantized_modules"] == ["router"]
    m = result.metrics
    assert m["export_check"] == "passed" and m["perplexity_ratio"] <= 1.02
    assert m["weight_bytes_ratio"] < 0.5


def test_export_check_catches_a_wrong_expert_scale(model_root: Path, run, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtbuild.core.data.sources import TextSource, load_texts, sequential_windows
    from trtbuild.runtime import load_target

    _, out = run
    tokenizer = AutoTokenizer.from_pretrained(model_root / "hf")
    ids = sequential_windows(tokenizer, load_texts(TextSource(kind="pydoc"), "eval"), 64, 4, bos=True,
                             separator="\n\n")
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(model_root / "hf")(input_ids=ids).logits
    # The stage showed the runtime on this export matches ModelOpt: use it as the fake-quant reference.
    reference = runtime_trace(load_target(out / "hf", dtype=torch.float32), ids)
    metrics = check_export(out / "hf", reference, base)
    assert metrics["export_layer_error_max"] == 0.0 and metrics["export_head_noise_median"] == 0.0
    broken = tmp_path / "broken"
    shutil.copytree(out / "hf", broken)
    state = load_file(broken / "model.safetensors")
    state["model.layers.1.feed_forward.experts.down_proj_weight_scale"] *= 1.5
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BuildError, match="does not reproduce.*decoder layer 1 "):
        check_export(broken, reference, base)


@pytest.mark.slow
def test_two_gloo_ranks_export_the_one_process_experts(model_root: Path, run, tmp_path: Path) -> None:
    """quantize.calibration.processes 2 on the MoE target: each rank holds half of every decoder layer
    (stacked experts included) and calibrates one of the two batches; the export equals one process's."""
    two = run_stage(model_root, tmp_path / "two", {**SMALL, "calibration": {**SMALL["calibration"], "processes": 2,
                                                                           "backend": "gloo"}})
    assert two.metrics["calibration_processes"] == 2
    one_dir, two_dir = run[1] / "hf", tmp_path / "two" / "hf"
    ref = {k: v for f in sorted(one_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    got = {k: v for f in sorted(two_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert set(got) == set(ref) and any("experts" in k and k.endswith("input_scale") for k in ref)
    for name, tensor in ref.items():
        assert torch.equal(got[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name
