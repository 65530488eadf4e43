"""The stages that run on the GPU host, in whichever Python runs them: .venv (transformers 5,
nvidia-modelopt 0.47) and .venv-trtllm11 (the TensorRT-LLM 1.1 container's transformers 4.57.1 and
nvidia-modelopt 0.37). What they write must be what TensorRT-LLM 1.1.0 reads (its contract).

- quantize: ModelOpt FP8 PTQ + the unified HF export of a small Llama with Llama 3.1 RoPE; the
  export's config.json carries top-level rope_theta / rope_scaling and the installed transformers
  reads theta 500000 and llama3 scaling from it; weights are float8_e4m3fn with float32 scales.
- engine: the bundle options and launch command of both GPU recipes against 1.1.0 (tests/test_contract.py
  holds the full matrix; this is the subset the second environment runs besides).
- draft: the export's tensor naming (ModelOpt 0.47 writes layers.0.*, trtbuild renames to midlayer.*;
  ModelOpt 0.37 itself writes midlayer.*), checked on the names a conversion produces.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtbuild.contract import load_contract
from trtbuild.contract import validate as cv

pytestmark = pytest.mark.trtllm11

LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def _tiny_llama() -> torch.nn.Module:
    import transformers

    kwargs = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, vocab_size=256, max_position_embeddings=1024, tie_word_embeddings=False,
                  architectures=["LlamaForCausalLM"])
    if transformers.__version__.startswith("4."):
        config = transformers.LlamaConfig(rope_theta=500000.0, rope_scaling=dict(LLAMA31_ROPE), **kwargs)
    else:
        config = transformers.LlamaConfig(rope_parameters={"rope_theta": 500000.0, **LLAMA31_ROPE}, **kwargs)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.eval()
    return model


@pytest.fixture(scope="module")
def fp8_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtbuild import modelopt_fp8
    from trtbuild.progress import Progress

    model = _tiny_llama()
    cfg = modelopt_fp8.quant_config(kv_cache=True, excluded=modelopt_fp8.resolve_excludes(model, ["lm_head"]))
    batches = torch.randint(3, 256, (8, 32), generator=torch.Generator().manual_seed(1))
    modelopt_fp8.calibrate(model, cfg, batches, batch_size=4, progress=Progress.for_terminal(enabled=False))
    summary = modelopt_fp8.quantizer_summary(model)
    assert "lm_head" in summary["unquantized"] and len(summary["quantized"]) == 14
    out = tmp_path_factory.mktemp("fp8") / "hf"
    out.mkdir()
    modelopt_fp8.export_hf(model, out)
    return out


def test_fp8_export_config_is_what_trtllm_11_reads(fp8_export: Path) -> None:
    import transformers

    config = json.loads((fp8_export / "config.json").read_text())
    assert cv.check_hf_config(config, load_contract("1.1.0")) == []
    assert config["rope_theta"] == 500000.0 and config["rope_scaling"]["rope_type"] == "llama3"
    read = transformers.AutoConfig.from_pretrained(str(fp8_export))
    params = getattr(read, "rope_parameters", None) or {}
    assert params.get("rope_theta", getattr(read, "rope_theta", None)) == 500000.0
    assert (getattr(read, "rope_scaling", None) or params)["factor"] == 8.0
    quant = json.loads((fp8_export / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "FP8" and quant["kv_cache_quant_algo"] == "FP8"


def test_fp8_export_weights(fp8_export: Path) -> None:
    from trtbuild.safetensors_header import read_header

    header = {}
    for file in fp8_export.glob("*.safetensors"):
        header.update(read_header(file))
    fp8 = [n for n, t in header.items() if t["dtype"] == "F8_E4M3"]
    assert len(fp8) == 14  # 7 linears x 2 layers; lm_head stays high precision
    assert all(header[n.replace(".weight", ".weight_scale")]["dtype"] == "F32" for n in fp8)
    assert header["lm_head.weight"]["dtype"] != "F8_E4M3"


@pytest.mark.parametrize("recipe_path", ["recipes/llama-3.1-8b-instruct-fp8-eagle3.yaml",
                                         "recipes/llama-4-maverick-fp8-eagle3-tp8.yaml"])
def test_engine_renders_gpu_recipes_for_11(recipe_path: str) -> None:
    from trtbuild.recipe import load_recipe
    from trtbuild.trtllm.conformance import recipe_violations

    root = Path(__file__).resolve().parents[1]
    recipe = load_recipe(root / recipe_path)
    assert recipe.engine.trtllm_version == "1.1.0"
    assert recipe_violations(recipe.engine, recipe) == []


def test_draft_export_renames_modelopt_layer_names() -> None:
    from trtbuild.eagle3.export import tensorrt_llm_names

    contract = load_contract("1.1.0")
    layer = contract.section("eagle3_draft")["layer_tensors"]
    modelopt_047 = {f"layers.0.{n}": 0 for n in layer} | {"fc.weight": 0, "norm.weight": 0, "d2t": 0}
    renamed = tensorrt_llm_names(modelopt_047, contract.draft_layer_prefix)
    assert cv.check_draft_tensors(renamed, contract) == []
    assert cv.check_draft_tensors(modelopt_047, contract)  # what ModelOpt 0.47 writes would not load


def test_installed_modelopt_eagle_export_names() -> None:
    """ModelOpt 0.37's HF export (the container's) names the EAGLE layer midlayer.* itself; 0.47 has a
    separate export_speculative_decoding writing layers.0.*, which trtbuild renames."""
    import modelopt

    if modelopt.__version__.startswith("0.37"):
        from modelopt.torch.export.plugins.hf_spec_export import EAGLE_MODELOPT_TO_OFFICIAL

        names = set(EAGLE_MODELOPT_TO_OFFICIAL["required"].values())
        contract = load_contract("1.1.0")
        assert {"midlayer." + n for n in contract.section("eagle3_draft")["layer_tensors"]} <= names
    else:
        from modelopt.torch.export import export_speculative_decoding  # noqa: F401
