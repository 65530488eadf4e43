"""The engine stage on real artifacts: bundle layout, hard links, options, launchers, the GEMM-plugin module."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from draft_fixtures import write_target

from trtbuild.app.recipe import load_recipe
from trtbuild.core.contract import available_versions
from trtbuild.core.contract.hf_config import legacy_rope_keys
from trtbuild.core.errors import UserError
from trtbuild.core.llm_args import read_options
from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.engine.bundle import build_options
from trtbuild.engine.facts import facts_from_dir
from trtbuild.engine.stage import EngineStage

HIDDEN, HEADS, KV_HEADS, LAYERS = 64, 4, 2, 4
DRAFT_AUX = [0, 1, 2]  # not TRT-LLM's default {1, L/2-1, L-4} = {0, 1} for L = 4


class RecordingProgress(Progress):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def write_draft(directory: Path) -> Path:
    """An EAGLE-3 draft checkpoint in the layout TRT-LLM reads (random weights, right shapes)."""
    import torch
    from safetensors.torch import save_file

    from trtbuild.draft.format import LAYER_TENSORS

    directory.mkdir(parents=True)
    head_dim = HIDDEN // HEADS
    kv = KV_HEADS * head_dim
    shapes = {"self_attn.q_proj.weight": (HIDDEN, 2 * HIDDEN), "self_attn.k_proj.weight": (kv, 2 * HIDDEN),
              "self_attn.v_proj.weight": (kv, 2 * HIDDEN),
              "self_attn.o_proj.weight": (HIDDEN, HIDDEN), "mlp.gate_proj.weight": (128, HIDDEN),
              "mlp.up_proj.weight": (128, HIDDEN), "mlp.down_proj.weight": (HIDDEN, 128)}
    generator = torch.Generator().manual_seed(0)
    tensors = {f"midlayer.{n}": torch.randn(shapes.get(n, (HIDDEN,)), generator=generator)
               for n in LAYER_TENSORS}
    tensors["fc.weight"] = torch.randn(HIDDEN, len(DRAFT_AUX) * HIDDEN, generator=generator)
    tensors["norm.weight"] = torch.ones(HIDDEN)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1,
        "intermediate_size": 128, "vocab_size": 384, "draft_vocab_size": 384,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": DRAFT_AUX, "use_aux_hidden_state": True}}))
    return directory


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("artifacts")
    write_target(root / "model" / "hf", num_hidden_layers=LAYERS)
    write_draft(root / "draft" / "eagle3")
    return {"model": root / "model", "draft": root / "draft"}


def _recipe(tmp_path: Path, engine: dict, draft: bool = True, **top: object):
    data = {"name": "bundle-test", "model": {"source": "path", "path": "m"}, "engine": engine, **top}
    if draft:
        data["draft"] = {"source": "train", "max_draft_len": 3}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_recipe(path)


def _run(tmp_path: Path, artifacts: dict[str, Path], engine: dict, draft: bool = True):
    recipe = _recipe(tmp_path, engine, draft)
    inputs = {"model": Artifact("model", "k-model", artifacts["model"])}
    if draft:
        inputs["draft"] = Artifact("draft", "k-draft", artifacts["draft"])
    progress = RecordingProgress()
    out = tmp_path / "out"
    out.mkdir()
    result = EngineStage().run(recipe.engine, StageContext(recipe, inputs, out, progress))
    return recipe, out / "bundle", result, progress


def _same_file(a: Path, b: Path) -> bool:
    sa, sb = a.stat(), b.resolve().stat()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def test_pytorch_bundle(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    engine = {"tensor_parallel": 2, "max_batch_size": 4, "env": {"TRTLLM_ENABLE_PDL": "1"},
              "kv_cache": {"free_gpu_memory_fraction": 0.75, "enable_block_reuse": False},
              "enable_autotuner": False, "cuda_graphs": [1, 2, 4]}
    recipe, bundle, result, progress = _run(tmp_path, artifacts, engine)

    # Without TensorRT-LLM: one line saying so, and the bundle is still complete.
    assert [line for line in progress.lines if "tensorrt_llm is not importable" in line] == progress.lines[:1]
    assert result.metrics["tensorrt_llm"] == "absent"

    # Target and draft are hard links to the input artifacts' files, not copies; config.json alone is
    # rewritten with RoPE at the top level (the form TRT-LLM 1.1's transformers reads), the input kept.
    source = artifacts["model"] / "hf"
    for file in source.iterdir():
        if file.name != "config.json":
            assert _same_file(bundle / "target" / file.name, file), file.name
    original, served = (json.loads(p.read_text()) for p in (source / "config.json", bundle / "target" / "config.json"))
    assert "rope_parameters" in original and "rope_theta" not in original
    assert served == legacy_rope_keys(original) and served["rope_theta"] == original["rope_parameters"]["rope_theta"]
    draft_weights = artifacts["draft"] / "eagle3" / "model.safetensors"
    assert _same_file(bundle / "draft" / "model.safetensors", draft_weights)
    assert result.metrics["bytes_linked"] > 50 * result.metrics["bytes_written"]

    # llm_api_options.yaml: exactly what the typed model builds, and it reads back equal.
    options = read_options(bundle / "llm_api_options.yaml")
    expected = build_options(recipe.engine, recipe, facts_from_dir(source), artifacts["draft"] / "eagle3")
    assert options == expected
    data = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())
    assert data["tensor_parallel_size"] == 2 and data["max_batch_size"] == 4
    assert data["max_seq_len"] == 256  # the target's max_position_embeddings
    assert data["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.75}
    assert data["cuda_graph_config"] == {"batch_sizes": [1, 2, 4], "enable_padding": False}
    assert data["enable_autotuner"] is False
    spec = data["speculative_config"]
    # 1.1.0 and 1.2.1 (the default)
    assert spec["decoding_type"] == "Eagle" and spec["max_draft_len"] == 3 and spec["eagle3_one_model"]
    assert spec["eagle3_layers_to_capture"] == DRAFT_AUX
    assert (bundle / spec["speculative_model_dir"]).is_dir()  # relative to the bundle root

    # Launchers are valid bash and bundle.json describes what is there.
    for script in ("serve.sh", "mpirun.sh", "slurm.sbatch"):
        path = bundle / "launch" / script
        assert os.access(path, os.X_OK)
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert "export TRTLLM_ENABLE_PDL=1" in (bundle / "launch" / "serve.sh").read_text()
    described = json.loads((bundle / "bundle.json").read_text())
    assert described["model"] == "target" and described["draft"] == "draft"
    for rel in (described["llm_api_options"], *described["launch"].values()):
        assert (bundle / rel).is_file()
    assert described["trtllm_version"] == "1.2.1" and described["gemm_plugin"] is None
    assert not (bundle / "build").exists() and not (bundle / "trtllm_module").exists()
    serve = (bundle / "launch" / "serve.sh").read_text()
    assert "--extra_llm_api_options llm_api_options.yaml" in serve and "PYTHONPATH" not in serve


def test_bundle_target_loads_with_transformers(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    """The linked target is a complete HF checkpoint (config, weights, tokenizer), same weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, bundle, _, _ = _run(tmp_path, artifacts, {}, draft=False)
    tokenizer = AutoTokenizer.from_pretrained(bundle / "target")
    ids = tokenizer("def main():", return_tensors="pt").input_ids
    with torch.no_grad():
        ours = AutoModelForCausalLM.from_pretrained(bundle / "target")(ids).logits
        ref = AutoModelForCausalLM.from_pretrained(artifacts["model"] / "hf")(ids).logits
    assert torch.equal(ours, ref)
    assert "speculative_config" not in yaml.safe_load((bundle / "llm_api_options.yaml").read_text())


def test_bundle_for_the_newest_contract(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    """engine.trtllm_version main-0004396: that release's decoding type, draft key and options flag."""
    _, bundle, _, _ = _run(tmp_path, artifacts, {"trtllm_version": "main-0004396"})
    spec = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and spec["speculative_model"] == "./draft"
    assert "speculative_model_dir" not in spec
    serve = (bundle / "launch" / "serve.sh").read_text()
    assert "--config llm_api_options.yaml" in serve and "--extra_llm_api_options" not in serve
    assert json.loads((bundle / "bundle.json").read_text())["trtllm_version"] == "main-0004396"


def test_gemm_plugin_needs_an_fp8_checkpoint(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    with pytest.raises(UserError) as err:
        _run(tmp_path, artifacts, {"gemm_plugin": {"kernels": {"sm_90a": "spatial_partition"}}}, draft=False)
    line = err.value.one_line()
    assert "engine.gemm_plugin" in line and "not an FP8 checkpoint" in line and "\n" not in line


def test_require_tensorrt_llm_is_a_one_line_error(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("TensorRT-LLM is installed here")
    with pytest.raises(UserError) as err:
        _run(tmp_path, artifacts, {"require_tensorrt_llm": True}, draft=False)
    line = err.value.one_line()
    assert "engine.require_tensorrt_llm" in line and "tensorrt_llm is not importable" in line
    assert "\n" not in line
    assert not any((tmp_path / "out").iterdir())  # nothing half-written


@pytest.fixture(scope="module")
def quantized(artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real quantize stage (ModelOpt FP8, unified HF export) on the test target."""
    from trtbuild.quantize.stage import QuantizeConfig, QuantizeStage

    out = tmp_path_factory.mktemp("quantize")
    config = QuantizeConfig.model_validate({
        "calibration": {"num_samples": 8, "seq_len": 32, "batch_size": 8},
        "gate": {"seq_len": 32, "eval_samples": 4, "max_perplexity_ratio": 10.0}})
    ctx = StageContext(recipe=RecipeInfo.standalone(), inputs={"model": Artifact("model", "k-model", artifacts["model"])},
                       out_dir=out)
    QuantizeStage().run(config, ctx)
    return out


STANDINS = Path(__file__).parent / "trtllm_standins"
STANDIN_OF = {"1.1.0": "rel_1_1", "1.2.1": "rel_1_2_1", "main-0004396": "rel_main"}


@pytest.mark.slow
@pytest.mark.parametrize("version", available_versions())
def test_gemm_plugin_bundle_ships_the_module_the_release_loads(tmp_path: Path, artifacts: dict[str, Path],
                                                               quantized: Path, version: str) -> None:
    """An FP8 bundle with engine.gemm_plugin: the module, its launch for `version`, the AOT check, and
    the Triton launcher; then the bundle's own module patches the stand-in of that release."""
    from deploy_fixtures import build_deploy

    from trtbuild.core.contract import load_contract, module_conventions
    from trtbuild.engine import conformance

    engine = {"trtllm_version": version, "gemm_plugin": {"kernels": {"sm_90a": "spatial_partition"}}}
    recipe = _recipe(tmp_path, engine, draft=False, gpu_archs=["sm_90a"], deploy={"target": ["trtllm"]})
    ctx = StageContext(recipe, {"model": Artifact("model", "k-model", artifacts["model"]),
                                "quantize": Artifact("quantize", "k-q", quantized)},
                       tmp_path / "out", RecordingProgress())
    ctx.out_dir.mkdir()
    result = EngineStage().run(recipe.engine, ctx)
    bundle = ctx.out_dir / "bundle"
    contract = load_contract(version)

    # TensorRT-LLM reads the stock FP8 checkpoint (hard-linked); no pre-shuffled copies any more.
    assert _same_file(bundle / "target" / "model.safetensors", quantized / "hf" / "model.safetensors")
    assert not list(bundle.glob("target-*"))
    module = bundle / "trtllm_module"
    assert (module / "sitecustomize.py").is_file() and (module / "trtbuild_gemm" / "__init__.py").is_file()
    config = json.loads((module / "trtbuild_gemm" / "config.json").read_text())
    assert config["kernels"] == {"sm_90a": "spatial_partition"} and config["max_tokens"] == 16
    assert config["releases"] == module_conventions() and version in config["releases"]

    # Launch: PYTHONPATH on every launcher; the custom-module flag only where trtllm-serve has it.
    serve = (bundle / "launch" / "serve.sh").read_text()
    assert 'export PYTHONPATH="$PWD/trtllm_module${PYTHONPATH:+:$PYTHONPATH}"' in serve
    assert "-x PYTHONPATH" in (bundle / "launch" / "mpirun.sh").read_text()
    assert 'export PYTHONPATH="${BUNDLE}/trtllm_module' in (bundle / "launch" / "slurm.sbatch").read_text()
    has_flag = "--custom_module_dirs ./trtllm_module/trtbuild_gemm" in serve
    assert has_flag is (contract.custom_module_flag is not None) is version.startswith("main")
    described = json.loads((bundle / "bundle.json").read_text())["gemm_plugin"]
    assert described["release"] == version and described["module"] == "trtllm_module/trtbuild_gemm"
    assert described["loaded_by"]["triton_llmapi"] == {"python_path": "trtllm_module"}

    # The conformance check reads the written launchers: one without the module's PYTHONPATH fails.
    assert conformance.module_violations(bundle, "trtllm_module", contract) == []
    (bundle / "launch" / "serve.sh").write_text(serve.replace("export PYTHONPATH=", "export OTHER="))
    broken = conformance.module_violations(bundle, "trtllm_module", contract)
    assert [v.field for v in broken] == ["launch/serve.sh:PYTHONPATH"] and "mpi_session.py@" in broken[0].fact
    (bundle / "launch" / "serve.sh").write_text(serve)

    # AOT: cubins with FP8 tensor-core MMAs and no spills, recorded in metrics.
    sass = result.metrics["gemm_plugin"]["sass"]["spatial_partition"]
    assert sass["ok"] and sass["archs"] == ["sm_90a"]
    assert sass["mma"] and sass["spill_bytes"] == 0 and sass["local_memory_ops"] == 0
    report = json.loads((bundle / "plugins" / "spatial_partition" / "sass_report.json").read_text())
    assert all((bundle / "plugins" / "spatial_partition" / k["cubin"]).is_file() for k in report["kernels"])

    # Triton: the LLM-API model has no import hook, so its start script exports the module's directory.
    deploy, _ = build_deploy(tmp_path, ctx.out_dir, recipe)
    start = (deploy / "launch" / "start_in_container.sh").read_text()
    assert "export PYTHONPATH=/bundle/trtllm_module" in start
    assert subprocess.run(["bash", "-n", str(deploy / "launch" / "start_in_container.sh")]).returncode == 0

    # The bundle's module, as a server process would start it (PYTHONPATH: the bundle's trtllm_module
    # first), patches the stand-in of this release and picks its convention by tensorrt_llm.__version__.
    code = ("import trtbuild_gemm\nfrom tensorrt_llm._torch.modules import linear as L\n"
            "import json\nprint(json.dumps([trtbuild_gemm.report(), hasattr(L.FP8QDQLinearMethod.apply, "
            "'__wrapped__'), 'trtbuild' in __import__('sys').modules]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(module), str(STANDINS / STANDIN_OF[version]),
                                                       str(STANDINS)]))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=bundle, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counts, patched, imported_trtbuild = json.loads(done.stdout.strip().splitlines()[-1])
    installed = [k for k in counts if k.startswith("installed:")]  # the release as installed (startup line)
    assert len(installed) == 1 and counts[installed[0]] == 1
    assert {k: v for k, v in counts.items() if k not in installed} == {f"release:{version}": 1}
    assert patched and not imported_trtbuild


MAVERICK_CONFIG = {  # the shape facts of Llama-4-Maverick-17B-128E's config.json
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "text_config": {"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "num_hidden_layers": 48, "num_local_experts": 128,
                    "max_position_embeddings": 1048576, "vocab_size": 202048}}
MAVERICK_ENGINE = {"tensor_parallel": 8, "expert_parallel": 1, "max_batch_size": 8,
                   "enable_min_latency": True, "enable_autotuner": False, "enable_attention_dp": False,
                   "cuda_graphs": True,
                   "kv_cache": {"free_gpu_memory_fraction": 0.75, "enable_block_reuse": False},
                   "eagle3_one_model": True, "env": {"TRTLLM_ENABLE_PDL": "1"}, "max_seq_len": 8192}


def test_maverick_record_recipe(tmp_path: Path) -> None:
    """The Llama 4 Maverick + EAGLE-3 record setup (TRT-LLM blog 6) passes preflight and gives its options."""
    from trtbuild.app.preflight import problems
    from trtbuild.engine.facts import facts_from_config

    model_dir = tmp_path / "maverick"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(MAVERICK_CONFIG))
    (model_dir / "model.safetensors").write_bytes(b"")
    data = {"name": "maverick", "gpu_archs": ["sm_100a"], "model": {"source": "path", "path": "maverick"},
            "quantize": {"export": "hf", "kv_cache": "fp8"}, "draft": {"source": "train", "max_draft_len": 3},
            "engine": MAVERICK_ENGINE}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    recipe = load_recipe(tmp_path / "r.yaml")
    assert [p for p in problems(recipe) if not p.startswith("model.")] == []

    draft = tmp_path / "eagle"
    draft.mkdir()
    default_layers = [1, 23, 44]  # TRT-LLM's default for 48 layers: not written into the options
    (draft / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids":
                                                                    default_layers}}))
    facts = facts_from_config(MAVERICK_CONFIG, "config.json")
    options = build_options(recipe.engine, recipe, facts, draft).to_dict()
    # The blog's extra_llm_api_options, key by key (it spells the decoding type "Eagle", as 1.1.0 does).
    assert options["enable_autotuner"] is False and options["enable_attention_dp"] is False
    assert options["enable_min_latency"] is True
    assert options["cuda_graph_config"]["max_batch_size"] == 8
    assert options["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.75}
    assert options["speculative_config"] == {"decoding_type": "Eagle", "max_draft_len": 3,
                                             "speculative_model_dir": "./draft", "eagle3_one_model": True}
    # ... and its command-line flags --tp_size 8 --ep_size 1, as LLM() arguments.
    assert options["tensor_parallel_size"] == 8 and options["moe_expert_parallel_size"] == 1


def test_pipeline_builds_then_reuses_the_bundle(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    """Through the real pipeline and cache: built once, cached the second time, linked into output_dir."""
    from trtbuild.app import pipeline
    from trtbuild.core.cache import ArtifactCache

    shutil.copytree(artifacts["model"] / "hf", tmp_path / "m")
    data = {"name": "pipe", "output_dir": "out", "model": {"source": "path", "path": "m"},
            "engine": {"max_batch_size": 2}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    recipe = load_recipe(tmp_path / "r.yaml")
    cache = ArtifactCache(tmp_path / "cache")
    first = {s.name: s for s in pipeline.build(recipe, cache, Progress())}
    assert first["engine"].status == "ran"
    second = {s.name: s for s in pipeline.plan(recipe, cache)}
    assert second["engine"].action == "cached" and second["engine"].key == first["engine"].key
    served = tmp_path / "out" / "engine" / "bundle"
    assert read_options(served / "llm_api_options.yaml").max_batch_size == 2
    assert _same_file(served / "target" / "model.safetensors", tmp_path / "m" / "model.safetensors")
    changed = load_recipe(tmp_path / "r.yaml", ["engine.max_batch_size=4"])
    third = {s.name: s for s in pipeline.plan(changed, cache)}
    assert third["engine"].action == "run" and third["model"].action == "cached"
