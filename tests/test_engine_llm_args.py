"""The typed model of TRT-LLM's LLM() arguments: round-trips through YAML and rejects unknown keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trtbuild.core.errors import UserError
from trtbuild.core.llm_args import (
    CudaGraphConfig,
    Eagle3DecodingConfig,
    KvCacheConfig,
    LlmApiOptions,
    parse_options,
    read_options,
    write_options,
)


def _maverick_like() -> LlmApiOptions:
    """The Llama 4 Maverick record options (TRT-LLM blog 6), in our typed model."""
    return LlmApiOptions(
        tensor_parallel_size=8, moe_expert_parallel_size=1, enable_attention_dp=False,
        enable_min_latency=True, enable_autotuner=False,
        cuda_graph_config=CudaGraphConfig(max_batch_size=8),
        kv_cache_config=KvCacheConfig(enable_block_reuse=False, free_gpu_memory_fraction=0.75),
        speculative_config=Eagle3DecodingConfig(decoding_type="Eagle3", max_draft_len=3,
                                                speculative_model_dir="./draft", eagle3_one_model=True),
    )


def test_round_trip_write_read_equal(tmp_path: Path) -> None:
    options = _maverick_like()
    path = tmp_path / "llm_api_options.yaml"
    write_options(options, path)
    again = read_options(path)
    assert again == options
    assert again.to_dict() == options.to_dict()
    # Writing what was read gives the same bytes: nothing drifts on a second pass.
    second = tmp_path / "again.yaml"
    write_options(again, second)
    assert second.read_text() == path.read_text()


def test_file_holds_only_what_was_set(tmp_path: Path) -> None:
    path = tmp_path / "o.yaml"
    write_options(_maverick_like(), path)
    data = yaml.safe_load(path.read_text())
    assert set(data) == {"tensor_parallel_size", "moe_expert_parallel_size", "enable_attention_dp",
                         "enable_min_latency", "enable_autotuner", "cuda_graph_config", "kv_cache_config",
                         "speculative_config"}
    assert data["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3,
                                          "speculative_model_dir": "./draft", "eagle3_one_model": True}
    assert data["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.75}


def test_decoding_type_is_required() -> None:
    """TRT-LLM dispatches on decoding_type; a file without it would not load."""
    with pytest.raises(UserError) as err:
        parse_options({"speculative_config": {"max_draft_len": 3, "speculative_model_dir": "d"}}, "x.yaml")
    assert err.value.field == "speculative_config.decoding_type"


def test_null_cuda_graph_config_survives(tmp_path: Path) -> None:
    """`cuda_graph_config: null` means "no CUDA graphs" to TRT-LLM; dropping it would turn them on."""
    options = LlmApiOptions(cuda_graph_config=None, max_batch_size=4)
    path = tmp_path / "o.yaml"
    write_options(options, path)
    assert "cuda_graph_config: null" in path.read_text()
    assert read_options(path) == options


@pytest.mark.parametrize("data, field", [
    ({"tensor_paralel_size": 2}, "tensor_paralel_size"),
    ({"kv_cache_config": {"free_gpu_mem_fraction": 0.5}}, "kv_cache_config.free_gpu_mem_fraction"),
])
def test_unknown_keys_are_errors(data: dict, field: str) -> None:
    with pytest.raises(UserError) as err:
        parse_options(data, "x.yaml")
    assert err.value.field == field
    assert "not a TensorRT-LLM LLM() argument" in err.value.one_line()


@pytest.mark.parametrize("data, field", [
    ({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}}, "kv_cache_config.free_gpu_memory_fraction"),
    ({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 0, "speculative_model_dir": "d"}},
     "speculative_config.max_draft_len"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
])
def test_bad_values_are_errors(data: dict, field: str) -> None:
    with pytest.raises(UserError) as err:
        parse_options(data, "x.yaml")
    assert err.value.field == field


def test_release_specific_rules_are_the_contracts() -> None:
    """Decoding type names, speculative fields and the cuda-graph pair differ by release: the typed
    model keeps them (tests/test_contract.py checks them against each release's contract)."""
    ok = parse_options({"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3,
                                               "speculative_model_dir": "d", "max_matching_ngram_size": 2},
                        "cuda_graph_config": {"batch_sizes": [1, 2, 8], "max_batch_size": 8}}, "x.yaml")
    assert ok.speculative_config is not None and ok.speculative_config.draft_path == "d"
    assert ok.to_dict()["speculative_config"]["max_matching_ngram_size"] == 2


def test_bad_yaml_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "o.yaml"
    path.write_text("max_batch_size: [1,\n")
    with pytest.raises(UserError, match="not valid YAML"):
        read_options(path)
