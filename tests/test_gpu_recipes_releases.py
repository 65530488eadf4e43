"""Both GPU recipes, rendered on their stand-ins, for each release the Triton images ship (1.1.0, 1.2.1).

The target is what NVIDIA's ModelOpt FP8 exports look like to TensorRT-LLM: the stand-in's config.json
(shapes) with no quantization_config, described only by hf_quant_config.json, beside a safetensors file;
the draft carries TensorRT-LLM's EAGLE-3 tensor names and draft_vocab_size. The engine stage writes the
bundle (GEMM-plugin module included, the kernels' AOT check for both archs) and checks it against the
release's contract; the deploy stage writes and checks the Triton LLM-API repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deploy_fixtures import build_deploy
from safetensors.numpy import save_file

from trtbuild.app.recipe import load_recipe
from trtbuild.core.contract import load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.progress import Progress
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.engine.stage import EngineStage

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {"llama-3.1-8b-instruct-fp8-eagle3": "llama-3.1-8b-instruct",
           "llama-4-maverick-fp8-eagle3-tp8": "llama-4-maverick-17b-128e"}


def fp8_export(directory: Path, standin: Path) -> Path:
    """config.json without quantization_config + hf_quant_config.json (ModelOpt's) + a safetensors file."""
    import numpy as np

    directory.mkdir(parents=True)
    config = json.loads(standin.read_text())
    config.pop("quantization_config", None)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}))
    save_file({"lm_head.weight": np.zeros((2, 2), dtype=np.float32)}, str(directory / "model.safetensors"))
    return directory


def eagle3_draft(directory: Path, contract_version: str) -> Path:
    import numpy as np

    draft = load_contract(contract_version).section("eagle3_draft")
    names = draft["required_tensors"] + [draft["layer_prefix"] + n for n in draft["layer_tensors"]]
    directory.mkdir(parents=True)
    save_file({n: np.zeros((2, 2), dtype=np.float16) for n in names}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"],
                                                       "draft_vocab_size": 32000, "rope_theta": 500000.0}))
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_gpu_recipe_builds_bundle_and_triton_repository_for_the_release(tmp_path: Path, name: str,
                                                                        version: str) -> None:
    image = load_contract(version).section("release")["triton_image"]  # the image that ships the release
    recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml", [f"engine.trtllm_version={version}",
                                                               f"deploy.trtllm.image={image}",
                                                               f"output_dir={tmp_path / 'out'}"])
    standin = ROOT / "recipes" / "standins" / RECIPES[name] / "config.json"
    model = tmp_path / "model"
    inputs = {"model": Artifact("model", "k-model", model), "draft": Artifact("draft", "k-draft", tmp_path / "d")}
    if recipe.quantize is not None:  # the 8B recipe quantizes: the export is the quantize artifact
        fp8_export(tmp_path / "q" / "hf", standin)
        inputs["quantize"] = Artifact("quantize", "k-q", tmp_path / "q")
        (model / "hf").mkdir(parents=True)
        (model / "hf" / "config.json").write_text(standin.read_text())
    else:  # Maverick: NVIDIA's FP8 export is the model itself
        fp8_export(model / "hf", standin)
    eagle3_draft(tmp_path / "d" / "eagle3", version)

    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    result = EngineStage().run(recipe.engine, StageContext(recipe, inputs, engine_dir, Progress()))
    bundle = engine_dir / "bundle"
    described = json.loads((bundle / "bundle.json").read_text())
    assert described["trtllm_version"] == version and described["gemm_plugin"]["release"] == version
    assert all(s["ok"] for s in result.metrics["gemm_plugin"]["sass"].values())

    # What the stage checked, checked again here from the written files.
    contract = load_contract(version)
    import yaml

    options = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())
    assert cv.check_llm_args(options, contract) == []
    assert options["speculative_config"]["decoding_type"] == contract.eagle3_decoding_type
    assert cv.check_draft_dir(bundle / "draft", contract) == []
    assert cv.check_hf_config(json.loads((bundle / "target" / "config.json").read_text()), contract) == []

    deploy, _ = build_deploy(tmp_path, engine_dir, recipe)
    model_yaml = yaml.safe_load(next((deploy / "repo_trtllm").glob("*/1/model.yaml")).read_text())
    assert cv.check_model_yaml(model_yaml, contract) == []
