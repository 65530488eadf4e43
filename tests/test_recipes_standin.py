"""The stand-in mechanism of the model stage (model.standin_config) and the plan's size estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtbuild.cli import main

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
LLAMA_8B = RECIPES_DIR / "standins" / "llama-3.1-8b-instruct" / "config.json"
MAVERICK = RECIPES_DIR / "standins" / "llama-4-maverick-17b-128e" / "config.json"


@pytest.fixture(autouse=True)
def _empty_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))


def _model_dir(root: Path, config: dict) -> Path:
    """A local HF directory: the config and a real (small) safetensors file."""
    import numpy as np
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    save_file({"lm_head.weight": np.zeros((2, 2), dtype=np.float32)}, str(root / "model.safetensors"))
    return root


def _recipe(tmp_path: Path, model: str, extra: str = "") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nmodel:\n{model}{extra}")
    return path


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_present_weights_win_over_the_standin(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    real = json.loads(LLAMA_8B.read_text())
    model_dir = _model_dir(tmp_path / "m", real)
    (tmp_path / "standin.json").write_text(LLAMA_8B.read_text())
    recipe = _recipe(tmp_path, "  source: path\n  path: m\n  standin_config: standin.json\n",
                     "engine:\n  tensor_parallel: 3\n  launcher: {gpus_per_node: 8}\n")
    err = _error(["validate", str(recipe)], capsys)
    assert f"num_attention_heads {real['num_attention_heads']} ({model_dir / 'config.json'})" in err
    assert "stand-in" not in err


def test_stale_standin_is_reported_once_the_weights_are_here(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]):
    real = json.loads(LLAMA_8B.read_text())
    real["num_hidden_layers"] = real["num_hidden_layers"] // 2
    _model_dir(tmp_path / "m", real)
    (tmp_path / "standin.json").write_text(LLAMA_8B.read_text())
    recipe = _recipe(tmp_path, "  source: path\n  path: m\n  standin_config: standin.json\n")
    err = _error(["validate", str(recipe)], capsys)
    standin_layers = json.loads(LLAMA_8B.read_text())["num_hidden_layers"]
    assert "model.standin_config" in err and "no longer matches" in err
    layers = real["num_hidden_layers"]
    assert f"num_hidden_layers {standin_layers} (stand-in) != {layers} (real config.json)" in err


def test_absent_path_plans_on_the_standin(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "standin.json").write_text(LLAMA_8B.read_text())
    recipe = _recipe(tmp_path, "  source: path\n  path: /nonexistent/llama\n  standin_config: standin.json\n")
    main(["plan", str(recipe), "--json"])
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes[0].startswith("weights absent: /nonexistent/llama does not exist")
    err = _error(["build", str(recipe)], capsys)
    assert "model.path" in err and "directory not found" in err


@pytest.mark.parametrize("standin,expected", [
    (None, "not found"),
    ('{"architectures": ["LlamaForCausalLM"]}', "lacks num_hidden_layers"),
    ("[1, 2]", "not a JSON object"),
    ("{nope", "not valid JSON"),
])
def test_unusable_standin_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], standin, expected):
    if standin is not None:
        (tmp_path / "standin.json").write_text(standin)
    recipe = _recipe(tmp_path, "  source: hub\n  repo_id: nobody/absent\n  standin_config: standin.json\n")
    err = _error(["validate", str(recipe)], capsys)
    assert "model.standin_config" in err and expected in err


def test_standin_needs_a_path_or_hub_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    recipe = _recipe(tmp_path, "  source: tiny\n  standin_config: standin.json\n")
    assert "standin_config is for source: path or hub" in _error(["validate", str(recipe)], capsys)


def test_absent_hub_model_without_standin_still_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    recipe = _recipe(tmp_path, "  source: hub\n  repo_id: nobody/absent\n")
    assert "not in the local HF cache" in _error(["validate", str(recipe)], capsys)


def test_absent_draft_is_an_error_when_the_target_is_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # Only a stand-in target excuses an absent draft; with the target present the draft must be too.
    recipe = _recipe(tmp_path, "  source: tiny\n", "draft:\n  source: hub\n  repo_id: nobody/absent-draft\n")
    assert "nobody/absent-draft" in _error(["validate", str(recipe)], capsys)


@pytest.mark.parametrize("config_file", [LLAMA_8B, MAVERICK], ids=["llama-3.1-8b", "maverick"])
def test_parameter_estimate_matches_transformers(config_file: Path):
    """estimate_parameters against the model transformers builds from the same config (meta device:
    shapes only), cut to 4 layers to stay fast (Maverick: 2 dense + 2 MoE); embeddings and the
    per-layer count are what the estimate must get right."""
    import torch
    from transformers import Llama4ForCausalLM, Llama4TextConfig, LlamaConfig, LlamaForCausalLM

    from trtbuild.app.gpu_plan import estimate_parameters

    config = json.loads(config_file.read_text())
    (config.get("text_config") or config)["num_hidden_layers"] = 4
    if "text_config" in config:
        with torch.device("meta"):
            model = Llama4ForCausalLM(Llama4TextConfig(**config["text_config"]))
    else:
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**config))
    assert estimate_parameters(config) == sum(p.numel() for p in model.parameters())
    from trtbuild.app.gpu_plan import parameter_layout

    outside, layers = parameter_layout(config)  # what `plan` sizes a calibration rank's shards from
    assert layers == [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    assert outside == sum(p.numel() for n, p in model.named_parameters() if ".layers." not in n)
