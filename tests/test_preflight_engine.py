"""Cross-stage preflight of the engine section: each mismatch is caught, in one line, before any work.

Recipes are real YAML files loaded with `trtbuild.app.recipe.load_recipe`; the target is a local model
directory whose config.json sets the heads / experts / context each case needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtbuild.app.preflight import problems
from trtbuild.app.recipe import load_recipe

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4,
         "max_position_embeddings": 512, "vocab_size": 1000, "intermediate_size": 512}
MOE = {**LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 6}
ODD_HEADS = {**LLAMA, "num_attention_heads": 12, "num_key_value_heads": 4}
PHI = {**LLAMA, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3"}


def _recipe(tmp_path: Path, sections: dict, model_config: dict = LLAMA, archs: list[str] | None = None):
    model_dir = tmp_path / "m"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model_config))
    (model_dir / "model.safetensors").write_bytes(b"")
    data = {"name": "t", "model": {"source": "path", "path": "m"}, **sections}
    if archs is not None:
        data["gpu_archs"] = archs
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_recipe(path)


def _engine_problems(recipe) -> list[str]:
    return [p for p in problems(recipe) if not p.startswith("model.")]


DRAFT = {"source": "train", "max_draft_len": 3}
FP8_HF = {"export": "hf"}

# (id, recipe sections, model config, gpu_archs, substrings of the one expected line)
CASES = [
    ("draft-len-over-trained", {"draft": DRAFT, "engine": {"draft_len": 5}}, LLAMA, None,
     ["engine.draft_len", "5 exceeds draft.max_draft_len 3", "fix:"]),
    ("draft-len-without-draft", {"engine": {"draft_len": 2}}, LLAMA, None,
     ["engine.draft_len", "no draft", "fix:"]),
    ("max-num-tokens-vs-draft", {"draft": DRAFT, "engine": {"max_batch_size": 64, "max_num_tokens": 128}},
     LLAMA, None, ["engine.max_num_tokens", "128", "64 x (1 + draft_len 3) = 256"]),
    ("tp-vs-heads", {"engine": {"tensor_parallel": 3}}, LLAMA, None,
     ["engine.tensor_parallel", "3 does not divide", "num_attention_heads 8", "1, 2, 4, 8"]),
    ("tp-vs-kv-heads", {"engine": {"tensor_parallel": 3, "launcher": {"gpus_per_node": 4}}}, ODD_HEADS, None,
     ["engine.tensor_parallel", "num_key_value_heads 4", "divide neither way"]),
    ("pp-vs-layers", {"engine": {"pipeline_parallel": 8}}, LLAMA, None,
     ["engine.pipeline_parallel", "8 exceeds", "num_hidden_layers 4"]),
    ("ep-on-dense", {"engine": {"tensor_parallel": 2, "expert_parallel": 2}}, LLAMA, None,
     ["engine.expert_parallel", "dense", "expert_parallel: 1"]),
    ("ep-vs-experts", {"engine": {"tensor_parallel": 4, "expert_parallel": 4}}, MOE, None,
     ["engine.expert_parallel", "4 does not divide", "6 experts", "1, 2, 3, 6"]),
    ("ep-vs-tp", {"engine": {"tensor_parallel": 2, "expert_parallel": 3}}, MOE, None,
     ["engine.expert_parallel", "3 does not divide engine.tensor_parallel 2"]),
    ("attention-dp-without-tp", {"engine": {"enable_attention_dp": True}}, LLAMA, None,
     ["engine.enable_attention_dp", "tensor_parallel is 1"]),
    ("seq-len-vs-context", {"engine": {"max_seq_len": 4096}}, LLAMA, None,
     ["engine.max_seq_len", "4096 exceeds", "max_position_embeddings 512", "<= 512"]),
    ("fp8-kv-without-scales", {"engine": {"kv_cache": {"dtype": "fp8"}}}, LLAMA, None,
     ["engine.kv_cache.dtype", "no calibrated FP8 KV scales", "quantize.kv_cache: fp8"]),
    ("bf16-kv-drops-scales", {"quantize": {"kv_cache": "fp8"}, "engine": {"kv_cache": {"dtype": "bfloat16"}}},
     LLAMA, None, ["engine.kv_cache.dtype", "bfloat16 discards the FP8 KV scales"]),
    ("unknown-plugin", {"quantize": FP8_HF, "engine": {"gemm_plugin": {"kernels": {"sm_90a": "gemm_shuffle"}}}},
     LLAMA, ["sm_90a"], ["engine.gemm_plugin.kernels.sm_90a", "unknown plugin 'gemm_shuffle'", "gemm_weight_shuffle"]),
    ("plugin-needs-fp8", {"engine": {"gemm_plugin": {"kernels": {"sm_90a": "spatial_partition"}}}}, LLAMA,
     ["sm_90a"], ["engine.gemm_plugin", "FP8 per-tensor linears", "add a quantize: section"]),
    ("plugin-vs-arch", {"quantize": FP8_HF, "engine": {"gemm_plugin": {"kernels": {"sm_89": "spatial_partition"}}}},
     LLAMA, ["sm_90a", "sm_89"], ["engine.gemm_plugin.kernels.sm_89", "not sm_89", "gemm_weight_shuffle"]),
    ("plugin-arch-not-targeted", {"quantize": FP8_HF, "engine": {"gemm_plugin": {"kernels": {
     "sm_100a": "spatial_partition"}}}}, LLAMA, ["sm_90a"],
     ["engine.gemm_plugin.kernels.sm_100a", "not among gpu_archs"]),
    ("fp8-vs-arch", {"quantize": FP8_HF, "engine": {}}, LLAMA, ["sm_80"],
     ["gpu_archs", "sm_80 has no FP8 tensor cores"]),
    ("world-vs-gpus", {"engine": {"tensor_parallel": 8, "pipeline_parallel": 2}}, LLAMA, None,
     ["engine.tensor_parallel", "16 ranks", "8 GPUs", "nodes to 2"]),
    ("multi-node-world", {"engine": {"tensor_parallel": 8, "launcher": {"nodes": 2}}}, LLAMA, None,
     ["engine.launcher.nodes", "16 MPI ranks but tp x pp = 8"]),
    ("cuda-graph-sizes", {"engine": {"max_batch_size": 4, "cuda_graphs": [1, 2, 8]}}, LLAMA, None,
     ["engine.cuda_graphs", "batch size 8 exceeds engine.max_batch_size 4"]),
    ("pdl-vs-arch", {"engine": {"env": {"TRTLLM_ENABLE_PDL": "1"}}}, LLAMA, ["sm_89", "sm_90a"],
     ["engine.env.TRTLLM_ENABLE_PDL", "sm_89", "programmatic dependent launch"]),
    ("owned-option-twice", {"engine": {"llm_api_options": {"max_batch_size": 4}}}, LLAMA, None,
     ["engine.llm_api_options.max_batch_size", "set engine.max_batch_size instead"]),
    ("bad-option-value", {"engine": {"llm_api_options": {"stream_interval": 0}}}, LLAMA, None,
     ["engine.llm_api_options.stream_interval", "greater than or equal to 1"]),
]


@pytest.mark.parametrize("sections, model_config, archs, expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_mismatch_is_caught(tmp_path: Path, sections: dict, model_config: dict, archs: list[str] | None,
                            expected: list[str]) -> None:
    found = _engine_problems(_recipe(tmp_path, sections, model_config, archs))
    matching = [line for line in found if all(s in line for s in expected)]
    assert matching, f"no line with {expected} in {found}"
    assert all("\n" not in line and "(fix: " in line for line in found)


def test_consistent_recipe_has_no_problems(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, {
        "quantize": {"export": "hf", "kv_cache": "fp8"}, "draft": DRAFT,
        "engine": {"tensor_parallel": 4, "max_seq_len": 512, "max_batch_size": 8, "draft_len": 3,
                   "cuda_graphs": [1, 2, 4, 8], "kv_cache": {"dtype": "fp8"},
                   "env": {"TRTLLM_ENABLE_PDL": "1"},
                   "gemm_plugin": {"kernels": {"sm_90a": "spatial_partition", "sm_100a": "spatial_partition"}}}})
    assert _engine_problems(recipe) == []


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    """Three mistakes -> three lines (the CLI joins them into one error, first one first)."""
    recipe = _recipe(tmp_path, {"engine": {"tensor_parallel": 3, "pipeline_parallel": 8, "draft_len": 2}})
    found = _engine_problems(recipe)
    assert len(found) >= 3
    assert any(p.startswith("engine.draft_len") for p in found)
    assert any(p.startswith("engine.pipeline_parallel") for p in found)


def test_tiny_target_facts_come_from_the_recipe(tmp_path: Path) -> None:
    """source: tiny has no config.json before the build; the recipe's model.tiny answers instead."""
    path = tmp_path / "r.yaml"
    path.write_text("name: t\nmodel:\n  source: tiny\nengine:\n  tensor_parallel: 7\n")
    found = _engine_problems(load_recipe(path))
    assert any("engine.tensor_parallel: 7 does not divide" in p and "model.tiny" in p for p in found), found


def test_validate_cli_reports_the_mismatch(tmp_path: Path) -> None:
    _recipe(tmp_path, {"engine": {"max_seq_len": 4096}})
    done = subprocess.run([sys.executable, "-m", "trtbuild.cli", "validate", str(tmp_path / "r.yaml")],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "engine.max_seq_len: 4096 exceeds" in lines[0]


def test_unknown_llm_api_option_is_a_schema_error(tmp_path: Path) -> None:
    from trtbuild.core.errors import UserError

    with pytest.raises(UserError) as err:
        _recipe(tmp_path, {"engine": {"llm_api_options": {"enable_chunk_prefill": True}}})
    assert "enable_chunk_prefill" in err.value.one_line()
    assert "engine.llm_api_options" in err.value.one_line()


def test_tensorrt_backend_is_a_one_line_error(tmp_path: Path) -> None:
    from trtbuild.core.errors import UserError

    with pytest.raises(UserError) as err:
        _recipe(tmp_path, {"engine": {"backend": "tensorrt"}})
    line = err.value.one_line()
    assert "engine.backend" in line and "PyTorch backend only" in line and "\n" not in line
