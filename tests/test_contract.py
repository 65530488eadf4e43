"""The GPU path against each supported TensorRT-LLM release's contract (trtbuild/core/contract/).

The two GPU recipes are rendered on their stand-ins (options YAML, trtllm-serve argv, Triton
LLM-API model.yaml and config.pbtxt inputs, requests) for every contract and must be accepted;
each rule that differs between releases is shown to fire on the release that has it, with a
one-line error naming the upstream fact. Tests marked trtllm11 also run in .venv-trtllm11 (the
TensorRT-LLM 1.1 container's transformers / nvidia-modelopt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtbuild.app.recipe import load_recipe
from trtbuild.core.contract import DEFAULT_VERSION, available_versions, load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.contract.hf_config import legacy_rope_keys
from trtbuild.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
GPU_RECIPES = ["recipes/llama-3.1-8b-instruct-fp8-eagle3.yaml", "recipes/llama-4-maverick-fp8-eagle3-tp8.yaml"]


def for_release(version: str) -> list[str]:
    """--set overrides rendering a recipe for `version` with an image that ships it (a custom image for a
    release no Triton image ships)."""
    image = load_contract(version).section("release").get("triton_image") or "registry.example/trtllm:main"
    return [f"engine.trtllm_version={version}", f"deploy.trtllm.image={image}"]
VERSIONS = available_versions()

pytestmark = pytest.mark.trtllm11


def test_the_default_is_the_newest_triton_images_release_and_1_1_is_kept() -> None:
    from trtbuild.deploy.config import TrtllmTargetOptions
    from trtbuild.engine.config import EngineConfig

    assert {"1.1.0", "1.2.1"} <= set(VERSIONS)
    assert DEFAULT_VERSION == "1.2.1" == EngineConfig().trtllm_version
    # The default image is the newest Triton image whose TensorRT-LLM has a contract, and it ships that one.
    images = {load_contract(v).section("release").get("triton_image"): v for v in VERSIONS}
    images.pop(None, None)
    newest = max(images, key=lambda image: image.rsplit(":", 1)[1])
    assert TrtllmTargetOptions().image == newest == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert images[newest] == DEFAULT_VERSION
    assert load_contract("1.1.0").section("release")["triton_image"].endswith("25.12-trtllm-python-py3")
    # What the container's Triton is (the GEMM kernels are JIT-compiled by it), per image.
    assert load_contract("1.1.0").section("release")["triton_python"].startswith("3.4.0")
    assert load_contract("1.2.1").section("release")["triton_python"].startswith("3.5.1")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_fact_names_an_upstream_path_at_a_commit(version: str) -> None:
    contract = load_contract(version)
    for source_id, where in contract.sources.items():
        assert "@" in where or "github.com/" in where, (source_id, where)
    # Every section's source ids resolve to a declared source.
    for name, section in contract.data.items():
        if isinstance(section, dict):
            for key, value in section.items():
                if key.endswith("source") and isinstance(value, str):
                    assert value in contract.sources, (version, name, key, value)


def _render(recipe_path: str, version: str):  # type: ignore[no-untyped-def]
    """Options, serve argv and Triton model.yaml of a GPU recipe on its stand-in, for `version`."""
    from trtbuild.core.bundle_info import BundleInfo
    from trtbuild.deploy.repo_trtllm import llmapi_model_yaml
    from trtbuild.engine.bundle import build_options
    from trtbuild.engine.checks import has_draft
    from trtbuild.engine.conformance import serve_spec
    from trtbuild.engine.facts import target_facts
    from trtbuild.engine.launchers import serve_argv

    recipe = load_recipe(ROOT / recipe_path, for_release(version))
    contract = load_contract(version)
    engine = recipe.engine
    options = build_options(engine, recipe, target_facts(recipe), None, with_draft=has_draft(recipe),
                            contract=contract)
    spec = serve_spec(engine, recipe, contract, served="target")
    argv = serve_argv(spec)
    bundle = BundleInfo(root=ROOT, backend="pytorch", served="target", tokenizer="target", draft="draft",
                        options=options, tensor_parallel=engine.tensor_parallel,
                        pipeline_parallel=engine.pipeline_parallel, trtllm_version=version)
    model_yaml = llmapi_model_yaml(recipe.deploy, bundle, recipe.deploy.max_batch_size or engine.max_batch_size)
    assert spec.python_path == "trtllm_module"  # both GPU recipes enable engine.gemm_plugin
    return recipe, contract, options.to_dict(), argv, model_yaml


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("recipe_path", GPU_RECIPES)
def test_gpu_recipes_are_accepted_by_every_release(recipe_path: str, version: str) -> None:
    recipe, contract, options, argv, model_yaml = _render(recipe_path, version)
    assert cv.check_llm_args(options, contract) == []
    assert cv.check_serve_argv(argv, contract) == []
    assert cv.check_module_launch(argv, "trtllm_module", "trtllm_module/trtbuild_gemm", contract) == []
    # The GEMM-plugin module: trtllm-serve's custom-module flag only where the release has one.
    flag = contract.custom_module_flag
    passed = [argv[i + 1] for i, a in enumerate(argv) if a == "--custom_module_dirs"]
    assert passed == (["./trtllm_module/trtbuild_gemm"] if flag else [])
    assert _launchers_name_the_module(recipe, version) == []
    assert cv.check_model_yaml(model_yaml, contract) == []
    rows = [{"name": n, "data_type": t} for n, t, _, _ in contract.triton_inputs]
    assert cv.check_triton_io(rows, contract) == []
    spec = options["speculative_config"]
    # The names are the release's: Eagle / speculative_model_dir in 1.1, Eagle3 / speculative_model after.
    assert spec["decoding_type"] == contract.eagle3_decoding_type
    assert spec[contract.draft_model_key] == "./draft"
    assert argv[argv.index(contract.serve_options_flag) + 1] == "llm_api_options.yaml"
    mount = recipe.deploy.trtllm.bundle_mount
    assert model_yaml["speculative_config"][contract.draft_model_key] == f"{mount}/draft"


def _launchers_name_the_module(recipe, version: str) -> list:  # type: ignore[no-untyped-def]
    """The launch scripts and the Triton start script a GPU recipe's bundle / deployment would hold,
    checked for the GEMM-plugin module's PYTHONPATH (what bundle_violations reads from the files)."""
    from trtbuild.core.bundle_info import BundleInfo
    from trtbuild.deploy.launch import start_in_container_script
    from trtbuild.engine import launchers
    from trtbuild.engine.conformance import serve_spec

    contract = load_contract(version)
    spec = serve_spec(recipe.engine, recipe, contract, served="target")
    cluster = launchers.ClusterSpec(nodes=2, gpus_per_node=spec.world_size)
    found = []
    for name, text in (("launch/serve.sh", launchers.single_node_script(spec)),
                       ("launch/mpirun.sh", launchers.mpirun_script(spec, cluster)),
                       ("launch/slurm.sbatch", launchers.slurm_script(spec, cluster))):
        found += cv.check_module_environment(text, "trtllm_module", contract, name)
    bundle = BundleInfo(root=ROOT, backend="pytorch", served="target", tokenizer="target", draft="draft",
                        options=None, env=dict(recipe.engine.env), trtllm_version=version,
                        python_path=spec.python_path)
    start = start_in_container_script(recipe.deploy, bundle, {"entry_model": recipe.deploy.model_name})
    mounted = f"{recipe.deploy.trtllm.bundle_mount}/trtllm_module"
    return found + cv.check_module_environment(start, mounted, contract, "start_in_container.sh", triton=True)


def test_what_one_release_writes_the_other_rejects_where_they_differ() -> None:
    _, old, options_11, argv_11, _ = _render(GPU_RECIPES[1], "1.1.0")
    _, new, options_new, argv_new, _ = _render(GPU_RECIPES[1], "main-0004396")
    # Issue 11, item 1: 1.1 knows only `Eagle`.
    bad = cv.check_llm_args(options_new, old)
    assert [v.field for v in bad] == ["llm_api_options.yaml:speculative_config.decoding_type"]
    assert "Eagle3" in bad[0].message and "@" in bad[0].fact
    # Item 2: 1.1's trtllm-serve has no --config, nor --custom_module_dirs (the module goes by PYTHONPATH).
    assert [v.field for v in cv.check_serve_argv(argv_new, old)] == ["launch/serve.sh:--custom_module_dirs",
                                                                       "launch/serve.sh:--config"]
    module = "trtllm_module/trtbuild_gemm"
    assert [v.field for v in cv.check_module_launch(argv_new, "trtllm_module", module, old)] == \
        ["launch/serve.sh:--custom_module_dirs"]
    # Newer main imports out-of-tree modules with --custom_module_dirs: a 1.1 launch that lacks it is caught.
    missing = cv.check_module_launch(argv_11, "trtllm_module", module, new)
    assert [v.field for v in missing] == ["launch/serve.sh:--custom_module_dirs"]
    assert "serve.py@" in missing[0].fact
    # The newer release still reads 1.1's options and flags (Eagle is converted; --extra_llm_api_options stays).
    assert cv.check_llm_args(options_11, new) == [] and cv.check_serve_argv(argv_11, new) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_the_module_needs_pythonpath_on_every_release(version: str) -> None:
    contract = load_contract(version)
    argv = ["trtllm-serve", "./target", "--custom_module_dirs", "./trtllm_module/trtbuild_gemm"]
    found = cv.check_module_launch(argv, None, "trtllm_module/trtbuild_gemm", contract)
    assert "launch/serve.sh:PYTHONPATH" in [v.field for v in found]
    workers = next(v for v in found if v.field.endswith("PYTHONPATH"))
    assert "sys.path" in workers.message and "mpi_session.py" in workers.fact
    script = "#!/usr/bin/env bash\nexport PYTHONPATH=\"$PWD/elsewhere\"\nexec trtllm-serve ./target\n"
    assert cv.check_module_environment(script, "trtllm_module", contract, "launch/serve.sh")
    assert cv.check_module_environment(script.replace("elsewhere", "trtllm_module"), "trtllm_module", contract,
                                       "launch/serve.sh") == []
    triton = cv.check_module_environment(script, "/bundle/trtllm_module", contract, "start_in_container.sh",
                                         triton=True)
    assert triton and "Triton model" in triton[0].message and "@" in triton[0].fact


def test_each_release_records_the_fp8_linear_the_module_patches() -> None:
    from trtbuild.core.contract import module_conventions

    conventions = module_conventions()
    assert sorted(conventions) == sorted(VERSIONS)
    for version, conv in conventions.items():
        assert "linear.py@" in conv["source"], version
        assert conv["linear"]["fp8_method_class"] == "FP8QDQLinearMethod"
        assert conv["linear"]["apply_params"][:4] == ["self", "module", "input", "bias"]
    assert conventions["1.1.0"]["linear"]["output_buffer_kind"] is None
    assert conventions["main-0004396"]["linear"]["output_buffer_kind"]["param"] == "output_buffer_kind"


def test_validate_exits_2_with_one_line_naming_the_field_and_the_fact() -> None:
    recipe = ROOT / GPU_RECIPES[0]
    done = subprocess.run([sys.executable, "-c", "from trtbuild.cli import main; main()", "validate", str(recipe),
                           "--set", "engine.llm_api_options={moe_config: {backend: WIDEEP2}}"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "moe_config.backend" in line and "upstream: NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py@" in line


@pytest.mark.parametrize("version, sizes, top, ok", [
    ("1.1.0", [1, 2, 8], 8, False),  # 1.1: both only if batch_sizes is its own generated list
    ("1.1.0", [1, 2, 8], 0, True),
    ("main-0004396", [1, 2, 8], 8, True),  # main: both if max_batch_size == max(batch_sizes)
    ("main-0004396", [1, 2, 8], 4, False),
])
def test_cuda_graph_pair_rule_is_the_releases(version: str, sizes: list[int], top: int, ok: bool) -> None:
    section = {"batch_sizes": sizes} | ({"max_batch_size": top} if top else {})
    found = cv.check_llm_args({"cuda_graph_config": section}, load_contract(version))
    assert (found == []) is ok, found


@pytest.mark.parametrize("version", VERSIONS)
def test_enums_and_unknown_fields(version: str) -> None:
    contract = load_contract(version)
    assert cv.check_llm_args({"moe_config": {"backend": "TRTLLM"}}, contract) == []
    assert cv.check_llm_args({"moe_config": {"backend": "trtllm"}}, contract)  # a Literal, case matters
    kv = cv.check_llm_args({"kv_cache_config": {"tokens_per_block": 64, "dtype": "fp8"}}, contract)
    # 1.1.0 withholds both (not confirmed at the release: llm_args.not_at_release, tests/test_release_fields.py)
    assert [v.field.rsplit(".", 1)[-1] for v in kv] == (["tokens_per_block", "dtype"] if version == "1.1.0" else [])
    assert cv.check_llm_args({"kv_cache_config": {"free_gpu_mem_fraction": 0.5}}, contract)
    assert cv.check_llm_args({"enable_min_latency": "yes"}, contract)  # a bool
    assert cv.check_llm_args({"tensor_paralel_size": 2}, contract)


@pytest.mark.parametrize("version", VERSIONS)
def test_ngram_speculation_is_checked_generically(version: str) -> None:
    contract = load_contract(version)
    good = {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2}
    assert cv.check_speculative(good, contract) == []
    assert cv.check_speculative(good | {"prompt_lookup_num_tokens": 4}, contract)  # an older release's name
    assert cv.check_speculative(good | {"max_matching_ngram_size": 0}, contract)


def test_launcher_flags_and_backends_the_release_lacks() -> None:
    old, new = load_contract("1.1.0"), load_contract("main-0004396")
    argv = ["trtllm-serve", "./engine", "--backend", "tensorrt", "--custom_module_dirs", "./plugins/x",
            "--extra_llm_api_options", "llm_api_options.yaml"]
    assert [v.field for v in cv.check_serve_argv(argv, old)] == ["launch/serve.sh:--custom_module_dirs"]
    assert [v.field for v in cv.check_serve_argv(argv, new)] == ["launch/serve.sh:--backend"]
    assert load_contract("main-0004396").trtllm_build_available is False


@pytest.mark.parametrize("version", VERSIONS)
def test_requests_use_the_llmapi_models_field_names(version: str) -> None:
    from trtbuild.serve.client import request_body

    contract = load_contract(version)
    ours = request_body("hi", 16, stream=True, temperature=0.0)
    ignored = cv.check_request(ours, contract)
    assert {v.field for v in ignored} == {"request:max_tokens", "request:stream", "request:temperature"}
    theirs = request_body("hi", 16, contract.request_fields, stream=True, temperature=0.0)
    assert theirs == {"text_input": "hi", "sampling_param_max_tokens": 16, "streaming": True,
                      "sampling_param_temperature": 0.0}
    assert cv.check_request(theirs, contract) == []


@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
def test_open_questions_of_the_release_contracts(version: str) -> None:
    """1.2.1: the EAGLE-3 option model has eagle3_layers_to_capture; 1.1.0: not confirmed at the release
    (seen only after release/1.1 branched), so the contract refuses it. Both: a draft config.json without
    draft_vocab_size does not load (Eagle3DraftModel reads it as an attribute)."""
    contract = load_contract(version)
    eagle = contract.section("speculative")["decoding_types"]["Eagle"]["fields"]
    has = version != "1.1.0"
    assert ("eagle3_layers_to_capture" in eagle) is has
    assert contract.section("eagle3_draft")["layers_to_capture_option"] is has
    options = {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "./draft",
               "eagle3_layers_to_capture": [1, 15, 28]}
    found = cv.check_speculative(options, contract)
    assert [v.field.rsplit(".", 1)[-1] for v in found] == ([] if has else ["eagle3_layers_to_capture"])
    config = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000}
    assert cv.check_draft_config(config, contract) == []
    missing = cv.check_draft_config({"architectures": ["LlamaForCausalLMEagle3"]}, contract)
    assert [v.field for v in missing] == ["draft/config.json:draft_vocab_size"]
    assert "modeling_speculative.py@b35ac1b6" in missing[0].fact


@pytest.mark.parametrize("version", VERSIONS)
def test_draft_tensor_names(version: str) -> None:
    contract = load_contract(version)
    draft = contract.section("eagle3_draft")
    midlayer = ["fc.weight", "norm.weight", "lm_head.weight", "d2t"] + [
        f"midlayer.{name}" for name in draft["layer_tensors"]]
    assert cv.check_draft_tensors(midlayer, contract) == []
    modelopt_047 = [n.replace("midlayer.", "layers.0.") for n in midlayer]
    bad = cv.check_draft_tensors(modelopt_047, contract)
    assert len(bad) == 1 and "layers.0." in bad[0].message and "midlayer." in bad[0].message
    assert cv.check_draft_tensors(midlayer[1:], contract)[0].field.endswith("fc.weight")


LLAMA31_ROPE = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _transformers5_config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "vocab_size": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "dtype": "bfloat16",
            "rope_parameters": dict(LLAMA31_ROPE)}


@pytest.mark.parametrize("version", VERSIONS)
def test_rope_parameters_only_is_a_violation_and_the_rewrite_fixes_it(version: str) -> None:
    contract = load_contract(version)
    config = _transformers5_config()
    found = cv.check_hf_config(config, contract)
    assert {v.field for v in found} == {"target/config.json:rope_theta", "target/config.json:rope_scaling"}
    fixed = legacy_rope_keys(config)
    assert cv.check_hf_config(fixed, contract) == []
    assert fixed["rope_theta"] == 500000.0 and fixed["rope_scaling"]["rope_type"] == "llama3"
    assert fixed["rope_parameters"] == LLAMA31_ROPE and fixed["torch_dtype"] == "bfloat16"
    # Llama 4: the text config carries RoPE.
    llama4 = {"model_type": "llama4", "text_config": dict(config, model_type="llama4_text")}
    assert [v.field for v in cv.check_hf_config(llama4, contract)][0].startswith(
        "target/config.json:text_config.rope_theta")
    assert cv.check_hf_config(legacy_rope_keys(llama4), contract) == []


def test_the_installed_transformers_reads_the_rewritten_rope(tmp_path: Path) -> None:
    """What the rewrite is for: LlamaConfig (4.57.1 in .venv-trtllm11, 5.x in .venv) reads theta
    500000 and llama3 scaling factor 8; from the transformers-5 form 4.57 would read 10000."""
    import transformers

    (tmp_path / "config.json").write_text(json.dumps(legacy_rope_keys(_transformers5_config())))
    config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    scaling = getattr(config, "rope_scaling", None) or params
    assert theta == 500000.0
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
    if transformers.__version__.startswith("4."):
        (tmp_path / "config.json").write_text(json.dumps(_transformers5_config()))
        assert transformers.AutoConfig.from_pretrained(str(tmp_path)).rope_theta == 10000.0


def test_unknown_version_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError, match="no TensorRT-LLM contract for version '0.9'"):
        load_contract("0.9")


def test_shipped_recipes_validate_on_both_releases() -> None:
    for recipe_path in GPU_RECIPES + ["recipes/tiny-cpu.yaml"]:
        for version in VERSIONS:
            recipe = load_recipe(ROOT / recipe_path, for_release(version))
            from trtbuild.app.preflight import problems

            assert problems(recipe) == [], (recipe_path, version)


def test_multi_instance_llmapi_needs_a_release_whose_model_reads_gpu_device_ids() -> None:
    params = {"gpu_device_ids": "0,1;2,3"}
    assert [v.field for v in cv.check_triton_parameters(params, load_contract("1.1.0"))] == [
        "config.pbtxt:parameters.gpu_device_ids"]
    assert cv.check_triton_parameters(params, load_contract("main-0004396")) == []


def test_the_deploy_image_must_ship_the_bundles_release() -> None:
    """A Triton image known to ship one release, with a bundle written for another: one line at validate."""
    from trtbuild.app.recipe_conformance import image_violations

    old, new = load_contract("1.1.0"), load_contract("1.2.1")
    assert image_violations("nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3", new) == []
    assert image_violations("nvcr.io/nvidia/tritonserver:26.01-trtllm-python-py3", old) == []
    bad = image_violations("nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", new)
    assert [v.field for v in bad] == ["deploy.trtllm.image"]
    assert "ships TensorRT-LLM 1.1.0" in bad[0].message and "engine.trtllm_version: 1.1.0" in bad[0].message
    assert "Dockerfile.triton.trt_llm_backend@" in bad[0].fact
    assert image_violations("nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3", new) == []  # no contract
    assert image_violations("my.registry/custom:latest", new) == []

    recipe = ROOT / GPU_RECIPES[0]
    done = subprocess.run([sys.executable, "-m", "trtbuild.cli", "validate", str(recipe), "--set",
                           "engine.trtllm_version=1.1.0"], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    fixed = subprocess.run([sys.executable, "-m", "trtbuild.cli", "validate", str(recipe),
                            *(a for o in for_release("1.1.0") for a in ("--set", o))], capture_output=True,
                           text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert fixed.returncode == 0, fixed.stderr
    assert done.returncode == 2 and "deploy.trtllm.image" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_llama4_targets_against_the_releases_llama4_model(version: str) -> None:
    """Maverick's published config loads as Llama4ForConditionalGeneration; a text-only
    Llama4ForCausalLM (what model.tiny.llama4 trains) has no model class in these releases."""
    from trtbuild.model.tiny import TinyModelConfig

    contract = load_contract(version)
    maverick = json.loads((ROOT / "recipes/standins/llama-4-maverick-17b-128e/config.json").read_text())
    assert cv.check_llama4_target(maverick, contract) == []
    tiny = TinyModelConfig(llama4={}).hf_config()
    fields = {v.field for v in cv.check_llama4_target(tiny, contract)}
    assert fields == {"target/config.json:architectures", "target/config.json:text_config"}
    assert all("modeling_llama.py@" in v.fact for v in cv.check_llama4_target(tiny, contract))
    wrapped = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": tiny}
    assert cv.check_llama4_target(wrapped, contract) == []
    section = contract.section("llama4_model")
    assert section["unquantized_modules"] == ["router"] and "experts" in section["quantized_modules"]
    assert set(section["reads"]) >= {"no_rope_layers", "interleave_moe_layer_step", "intermediate_size_mlp"}
    assert cv.check_llama4_target(TinyModelConfig().hf_config(), contract) == []  # a Llama: not this check
    # what the engine stage writes a text-only target as (trtbuild/engine/llama4_wrap.py)
    assert section["weight_prefix"] == "language_model." and section["exclude_modules_match"] == "unprefixed"
    assert section["vision_weights_required"] is False and section["text_only_checked_on_gpu"] is False
    assert all("@" in contract.fact(s) for s in ("llama4_weight_mapper", "llama4_exclude_match", "llama4_model_older"))
