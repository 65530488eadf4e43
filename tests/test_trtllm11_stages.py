"""The stages that run on the GPU host, in whichever Python runs them: .venv (transformers 5,
nvidia-modelopt 0.47) and .venv-trtllm11 (the TensorRT-LLM 1.1 container's transformers 4.57.1 and
nvidia-modelopt 0.37). What they write must be what TensorRT-LLM 1.1.0 reads (its contract).

- quantize: ModelOpt FP8 PTQ + the unified HF export of a small Llama with Llama 3.1 RoPE; the
  export's config.json carries top-level rope_theta / rope_scaling and the installed transformers
  reads theta 500000 and llama3 scaling from it; weights are float8_e4m3fn with float32 scales.
- engine: the bundle options and launch command of both GPU recipes against 1.1.0 (tests/test_contract.py
  holds the full matrix; this is the subset the second environment runs besides).
- draft: the export's tensor naming (ModelOpt 0.47 writes layers.0.*, trtbuild renames to midlayer.*;
  ModelOpt 0.37 itself writes midlayer.*), checked on the names a conversion produces; and a tiny
  draft trained by the installed ModelOpt (trtbuild.draft.modelopt_compat adapts 0.37): the same
  checkpoint format either way, and trtbuild's runtime drafts what the trained module drafts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtbuild.core.contract import load_contract
from trtbuild.core.contract import validate as cv

pytestmark = pytest.mark.trtllm11

LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def _llama31_rope() -> dict:
    """LlamaConfig keyword arguments for Llama 3.1 RoPE in the installed transformers (4.57 or 5)."""
    import transformers

    if transformers.__version__.startswith("4."):
        return {"rope_theta": 500000.0, "rope_scaling": dict(LLAMA31_ROPE)}
    return {"rope_parameters": {"rope_theta": 500000.0, **LLAMA31_ROPE}}


def _tiny_llama() -> torch.nn.Module:
    import transformers

    kwargs = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, vocab_size=256, max_position_embeddings=1024, tie_word_embeddings=False,
                  architectures=["LlamaForCausalLM"])
    config = transformers.LlamaConfig(**_llama31_rope(), **kwargs)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.eval()
    return model


@pytest.fixture(scope="module")
def fp8_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtbuild.core.progress import Progress
    from trtbuild.quantize import modelopt_fp8

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
    from trtbuild.core.safetensors_header import read_header

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
    from trtbuild.app.recipe import load_recipe
    from trtbuild.app.recipe_conformance import recipe_violations

    root = Path(__file__).resolve().parents[1]
    assert load_recipe(root / recipe_path).engine.trtllm_version == "1.2.1"  # the 26.07 image's; 1.1 kept
    recipe = load_recipe(root / recipe_path, ["engine.trtllm_version=1.1.0",
                                              "deploy.trtllm.image=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"])
    assert recipe.engine.trtllm_version == "1.1.0"
    assert recipe_violations(recipe.engine, recipe) == []


def test_draft_export_renames_modelopt_layer_names() -> None:
    from trtbuild.draft.export import tensorrt_llm_names

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


DRAFT_VOCAB = 256  # < the target's 384: the export carries d2t and the draft's own lm_head


@pytest.fixture(scope="module")
def trained_draft(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A tiny EAGLE-3 draft (random start) trained for a few steps by the installed ModelOpt (0.37 in
    .venv-trtllm11, 0.47 in .venv) on a random Llama target with Llama 3.1 RoPE, then exported the way
    the draft stage does."""
    from draft_fixtures import random_eagle3, write_target

    from trtbuild.core.progress import Progress
    from trtbuild.draft.export import export_draft
    from trtbuild.draft.train import TrainPlan, train

    root = tmp_path_factory.mktemp("draft11")
    target_dir = write_target(root / "target", num_hidden_layers=4, **_llama31_rope())
    model, _ = random_eagle3(target_dir, 4, DRAFT_VOCAB)
    before = {k: v.clone() for k, v in model.eagle_module.state_dict().items()}
    pool = torch.randint(3, 384, (16, 32), generator=torch.Generator().manual_seed(0))
    result = train(model, pool, TrainPlan(steps=4, batch_size=4, lr=3e-3, seed=0, warmup_steps=1),
                   root / "resume", Progress.for_terminal(enabled=False))
    changed = [k for k, v in model.eagle_module.state_dict().items() if not torch.equal(v, before[k])]
    export_draft(model, root / "draft", target_dir=target_dir, dtype="float32", layer_prefix="midlayer.")
    return model, target_dir, root / "draft", result, changed


def test_draft_training_runs_with_installed_modelopt(trained_draft) -> None:  # type: ignore[no-untyped-def]
    from trtbuild.draft.modelopt_compat import effective_ttt_steps, ignored_settings, is_legacy

    model, _, _, result, changed = trained_draft
    assert result.steps == 4 and len(result.step_accuracy) == effective_ttt_steps(3)
    assert bool(ignored_settings(3, 0.9)) == is_legacy()  # 0.37's fixed unroll is reported, 0.47 honours both
    assert all(0.0 <= a <= 1.0 for a in result.step_accuracy) and result.final_loss > 0
    trainable = {n for n, p in model.eagle_module.named_parameters() if p.requires_grad}
    assert trainable and trainable <= set(changed)  # every draft weight was updated


def test_trained_draft_is_the_format_trtllm_11_reads(trained_draft) -> None:  # type: ignore[no-untyped-def]
    """Tensor names, shapes and config keys: what the ModelOpt 0.47 path writes (its export copies the
    base lm_head when the draft has none, d2t only for a smaller draft vocabulary; config = 0.47's
    template, kept equal to ModelOpt 0.47's by tests/test_draft_export.py)."""
    from safetensors import safe_open

    from trtbuild.core.contract.validate import check_draft_dir
    from trtbuild.draft.format import default_aux_layers
    from trtbuild.draft.modelopt_compat import DRAFT_CONFIG_TEMPLATE

    _, target_dir, draft_dir, _, _ = trained_draft
    contract = load_contract("1.1.0")
    draft = contract.section("eagle3_draft")
    prefix = contract.draft_layer_prefix
    expected = set(draft["required_tensors"]) | {prefix + n for n in draft["layer_tensors"]} | {"lm_head.weight"}
    expected |= {"d2t"}  # DRAFT_VOCAB < vocab_size
    with safe_open(str(draft_dir / "model.safetensors"), framework="pt") as handle:
        shapes = {name: list(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118 (safe_open is not iterable)
        d2t = handle.get_tensor("d2t")
    assert set(shapes) == expected
    target = json.loads((target_dir / "config.json").read_text())
    hidden, inter = target["hidden_size"], target["intermediate_size"]
    q, kv = target["num_attention_heads"] * target["head_dim"], target["num_key_value_heads"] * target["head_dim"]
    n_aux = len(default_aux_layers(target["num_hidden_layers"]))
    want = {"fc.weight": [hidden, n_aux * hidden], "norm.weight": [hidden], "lm_head.weight": [DRAFT_VOCAB, hidden],
            "d2t": [DRAFT_VOCAB], f"{prefix}self_attn.q_proj.weight": [q, 2 * hidden],
            f"{prefix}self_attn.k_proj.weight": [kv, 2 * hidden], f"{prefix}self_attn.v_proj.weight": [kv, 2 * hidden],
            f"{prefix}self_attn.o_proj.weight": [hidden, q], f"{prefix}mlp.gate_proj.weight": [inter, hidden],
            f"{prefix}mlp.up_proj.weight": [inter, hidden], f"{prefix}mlp.down_proj.weight": [hidden, inter]}
    want |= {f"{prefix}{n}.weight": [hidden] for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    assert shapes == want
    assert d2t.dtype == torch.int64
    config = json.loads((draft_dir / "config.json").read_text())
    assert set(config) == set(DRAFT_CONFIG_TEMPLATE)
    assert set(config["eagle_config"]) == set(DRAFT_CONFIG_TEMPLATE["eagle_config"])
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == default_aux_layers(4)
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["vocab_size"] == target["vocab_size"]
    rope = target.get("rope_parameters") or {**target["rope_scaling"], "rope_theta": target["rope_theta"]}
    assert config["rope_theta"] == rope["rope_theta"] == 500000.0  # top level, what transformers 4.57 reads
    assert config["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "max_position_embeddings", "bos_token_id", "eos_token_id"):
        assert config[key] == target[key], key
    assert config["num_hidden_layers"] == 1 and config["torch_dtype"] == "float32"
    assert config["eagle_config"]["use_aux_hidden_state"] and config["eagle_config"]["use_last_layernorm"]
    assert check_draft_dir(draft_dir, contract) == []
    assert {p.name for p in draft_dir.iterdir()} >= {"tokenizer.json", "tokenizer_config.json"}


def test_runtime_runs_the_trained_draft(trained_draft) -> None:  # type: ignore[no-untyped-def]
    """trtbuild's runtime drafts what the trained ModelOpt module drafts (the TRT-LLM first-layer form;
    the doubled-norm form does not), and greedy speculative decoding equals plain greedy decoding."""
    from draft_fixtures import base_token, runtime_chain

    from trtbuild.runtime.draft import load_draft
    from trtbuild.runtime.generate import Generator, SpecParams
    from trtbuild.runtime.target import load_target

    model, target_dir, draft_dir, _, _ = trained_draft
    target = load_target(target_dir)
    prompts = torch.randint(3, 384, (3, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = [model.pseudo_speculative_generate(p[None], steps=4) for p in prompts]
    for norm, should_match in (("standard", True), ("modelopt", False)):
        draft = load_draft(draft_dir, target, first_norm=norm)
        matches = [torch.equal(e[1], runtime_chain(target, draft, p[None], 4)) for e, p in zip(expected, prompts,
                                                                                                strict=True)]
        assert all(torch.equal(e[0], base_token(target, p[None])) for e, p in zip(expected, prompts, strict=True))
        assert all(matches) if should_match else not all(matches), (norm, matches)
    generator = Generator(target, load_draft(draft_dir, target))
    for prompt in prompts.tolist():
        plain = generator.generate(prompt, 16).tokens
        spec = generator.generate(prompt, 16, spec=SpecParams(max_draft_len=3))
        assert spec.tokens == plain and len(plain) == 16
