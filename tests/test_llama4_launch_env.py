"""Issue 37.6: a text-only Llama 4 target is served with TLLM_MULTIMODAL_DISAGGREGATED=1.

At the contracted commit (modeling_llama.py@3a5901cd, contract llama4_model.text_only_load_needs) the
variable is read when modeling_llama is imported; unset, Llama4ForConditionalGeneration builds a
Llama4VisionEncoder and, finding no vision tensors, loads it with transformers' load_sharded_checkpoint
from the whole checkpoint. The engine stage wraps a text-only target (trtllm/llama4_wrap.py), so its
launchers and bundle.json (read by the Triton launcher) carry the variable; a plain Llama target does not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from trtbuild.app.recipe import load_recipe
from trtbuild.core.bundle_info import BundleInfo
from trtbuild.core.contract import load_contract
from trtbuild.core.progress import Progress
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.deploy.launch import start_in_container_script
from trtbuild.engine.stage import EngineStage


class _Quiet(Progress):
    def log(self, message: str) -> None:
        pass


def _llama4_text(root: Path) -> None:
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(0)
    config = Llama4TextConfig(
        vocab_size=128, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
        interleave_moe_layer_step=2, use_qk_norm=False, attention_chunk_size=16, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
    Llama4ForCausalLM(config).save_pretrained(root / "hf")


def _bundle(tmp_path: Path, model: Path, version: str) -> Path:
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "name": "llama4-env", "model": {"source": "path", "path": str(model / "hf")},
        "engine": {"trtllm_version": version},
        "deploy": {"target": ["trtllm"], "trtllm": {"image": load_contract(version).section("release")["triton_image"]}}}))
    recipe = load_recipe(tmp_path / "r.yaml")
    out = tmp_path / "out"
    out.mkdir()
    EngineStage().run(recipe.engine, StageContext(recipe, {"model": Artifact("model", "k", model)}, out, _Quiet()))
    return out / "bundle"


@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
def test_text_only_llama4_launchers_set_the_variable(tmp_path: Path, version: str) -> None:
    needs = load_contract(version).section("llama4_model")["text_only_load_needs"]["env"]
    assert needs == {"TLLM_MULTIMODAL_DISAGGREGATED": "1"}
    _llama4_text(tmp_path / "model")
    bundle = _bundle(tmp_path, tmp_path / "model", version)
    assert json.loads((bundle / "target" / "config.json").read_text())["architectures"] == [
        "Llama4ForConditionalGeneration"]
    for script in ("serve.sh", "mpirun.sh", "slurm.sbatch"):
        assert "export TLLM_MULTIMODAL_DISAGGREGATED=1" in (bundle / "launch" / script).read_text(), script
    assert "-x TLLM_MULTIMODAL_DISAGGREGATED" in (bundle / "launch" / "mpirun.sh").read_text()
    described = json.loads((bundle / "bundle.json").read_text())
    assert described["env"] == needs
    info = BundleInfo(root=bundle, backend="pytorch", served="target", tokenizer="target", draft=None,
                      options=None, env=described["env"], trtllm_version=version)
    recipe = load_recipe(tmp_path / "r.yaml")
    start = start_in_container_script(recipe.deploy, info, {"entry_model": "llm"})
    assert "export TLLM_MULTIMODAL_DISAGGREGATED=1" in start


def test_a_llama_target_gets_no_multimodal_variable(tmp_path: Path) -> None:
    from draft_fixtures import write_target

    write_target(tmp_path / "model" / "hf", num_hidden_layers=2)
    bundle = _bundle(tmp_path, tmp_path / "model", "1.2.1")
    assert "TLLM_MULTIMODAL_DISAGGREGATED" not in (bundle / "launch" / "serve.sh").read_text()
    assert json.loads((bundle / "bundle.json").read_text())["env"] == {}
