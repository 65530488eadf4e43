"""The deploy stage's repositories, from real engine bundles, checked against the bundle.

Each config.pbtxt is parsed here with protobuf's text_format into tritonclient's ModelConfig
(independently of the stage's own check), and the values are compared with what the engine
bundle says: paths, batch size, draft length.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_fixtures import build_deploy, build_engine, make_recipe, write_sources
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtbuild.core.errors import BuildError, UserError
from trtbuild.core.llm_args import parse_options, read_options
from trtbuild.core.pbtxt import Enum, check_repository, write_config

MOUNT = "/bundle"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_sources(tmp_path_factory.mktemp("sources"))


def parse(path: Path) -> model_config_pb2.ModelConfig:
    message = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(), message)
    return message


def all_configs(repo: Path) -> dict[str, model_config_pb2.ModelConfig]:
    return {p.parent.name: parse(p) for p in sorted(repo.glob("*/config.pbtxt"))}


def no_placeholders(root: Path) -> None:
    for file in root.rglob("*"):
        if file.is_file() and not file.is_symlink():
            assert "${" not in file.read_text(errors="replace") or file.suffix == ".sh", file


def to_bundle(server_path: str, bundle: Path) -> Path:
    """A server-side path under the mount, back on this host."""
    assert posixpath.commonpath([server_path, MOUNT]) == MOUNT, server_path
    return bundle / posixpath.relpath(server_path, MOUNT)


def params(message: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in message.parameters.items()}


def test_pytorch_llmapi_repository_agrees_with_bundle(tmp_path: Path, sources: dict[str, Path]) -> None:
    recipe = make_recipe(tmp_path, engine={"max_batch_size": 6, "cuda_graphs": [1, 2, 4]},
                         deploy={"model_name": "tiny", "decoupled": True})
    engine = build_engine(tmp_path, sources, recipe)
    deploy, result = build_deploy(tmp_path, engine, recipe)
    bundle = engine / "bundle"
    options = read_options(bundle / "llm_api_options.yaml")
    repo = deploy / "repo_trtllm"

    configs = all_configs(repo)
    assert list(configs) == ["tiny"]
    config = configs["tiny"]
    assert (config.backend, config.max_batch_size) == ("python", 0)
    assert config.model_transaction_policy.decoupled is True
    no_placeholders(deploy)

    model_yaml = yaml.safe_load((repo / "tiny" / "1" / "model.yaml").read_text())
    triton = model_yaml.pop("triton_config")
    assert triton["decoupled"] == config.model_transaction_policy.decoupled
    assert triton["max_batch_size"] == config.max_batch_size == 0  # the LLM batches, not Triton
    # Same LLM() arguments as the bundle, plus the checkpoint itself; paths seen through the mount.
    bundle_args = options.to_dict()
    assert set(model_yaml) == set(bundle_args) | {"model"}
    assert to_bundle(model_yaml["model"], bundle).resolve() == (bundle / "target").resolve()
    assert (to_bundle(model_yaml["model"], bundle) / "config.json").is_file()
    spec, bundle_spec = model_yaml.pop("speculative_config"), bundle_args.pop("speculative_config")
    assert spec["max_draft_len"] == bundle_spec["max_draft_len"] == 3
    assert (to_bundle(spec["speculative_model_dir"], bundle) / "model.safetensors").is_file()
    assert to_bundle(spec["speculative_model_dir"], bundle).resolve() == \
        (bundle / bundle_spec["speculative_model_dir"]).resolve()
    model_yaml.pop("model")
    assert model_yaml == bundle_args
    assert model_yaml["max_batch_size"] == recipe.engine.max_batch_size == 6
    # The file is valid for the engine's typed model of LLM() arguments, too.
    parse_options({k: v for k, v in yaml.safe_load((repo / "tiny/1/model.yaml").read_text()).items()
                   if k != "triton_config"}, "model.yaml")

    description = json.loads((deploy / "deploy.json").read_text())
    assert description["max_batch_size"] == 6 and description["max_draft_len"] == 3
    assert result.metrics["local_speculative"] is True


def test_local_repository_names_bundle_dirs(tmp_path: Path, sources: dict[str, Path]) -> None:
    recipe = make_recipe(tmp_path, deploy={"target": "local", "max_batch_size": 2,
                                           "local": {"num_threads": 1, "draft_len_schedule": {"1": 3, "2": 1}}})
    engine = build_engine(tmp_path, sources, recipe)
    deploy, _ = build_deploy(tmp_path, engine, recipe)
    assert not (deploy / "repo_trtllm").exists()
    model_dir = deploy / "repo_local" / "llm"
    config = parse(model_dir / "config.pbtxt")
    values = params(config)
    assert config.max_batch_size == 2 and config.backend == "python"
    assert (model_dir / "1" / "model.py").read_text() == \
        (Path(__file__).parents[1] / "trtbuild/deploy/local_model.py").read_text()
    # Relative to the model dir, through the deploy artifact's link to the engine bundle.
    assert (model_dir / values["target_dir"]).resolve() == (engine / "bundle" / "target").resolve()
    assert (model_dir / values["draft_dir"]).resolve() == (engine / "bundle" / "draft").resolve()
    assert values["max_draft_len"] == "3" and values["speculative"] == "true"
    assert (deploy / "bundle").is_symlink() and not Path((deploy / "bundle").readlink()).is_absolute()
    assert values["num_threads"] == "1"
    assert json.loads(values["draft_len_schedule"]) == {"1": 3, "2": 1}  # local_model.py reads it as JSON


def test_multi_gpu_llmapi_model_runs_one_tritonserver(tmp_path: Path, sources: dict[str, Path]) -> None:
    """tp x pp = 4, two instances: the LLM-API model starts its ranks itself (one tritonserver), and each
    instance gets its GPUs through gpu_device_ids where the release reads it (after 1.1)."""
    engine = {"tensor_parallel": 2, "pipeline_parallel": 2, "trtllm_version": "main-0004396"}
    recipe = make_recipe(tmp_path, engine=engine, draft=False,
                         deploy={"target": "trtllm", "http_port": 9000, "instance_count": 2})
    engine_dir = build_engine(tmp_path, sources, recipe)
    deploy, _ = build_deploy(tmp_path, engine_dir, recipe)
    config = parse(deploy / "repo_trtllm" / "llm" / "config.pbtxt")
    assert params(config)["gpu_device_ids"] == "0,1,2,3;4,5,6,7"
    assert config.instance_group[0].count == 2
    model_yaml = yaml.safe_load((deploy / "repo_trtllm" / "llm" / "1" / "model.yaml").read_text())
    assert (model_yaml["tensor_parallel_size"], model_yaml["pipeline_parallel_size"]) == (2, 2)
    start = (deploy / "launch" / "start_in_container.sh").read_text()
    command = start.splitlines()[-1]
    assert command.startswith("exec tritonserver ") and "mpirun" not in start and command.count("tritonserver") == 1
    assert 'cp "$ALL_MODELS/llmapi/tensorrt_llm/1/"*.py "$REPO/llm/1/"' in start
    assert "PYTHONPATH" not in start  # no GEMM-plugin module in this bundle
    docker = (deploy / "launch" / "triton_trtllm.sh").read_text()
    assert "-p 127.0.0.1:9000:8000" in docker and "-p 9000" not in docker and recipe.deploy.trtllm.image in docker
    assert '-v "$BUNDLE":/bundle:ro' in docker
    for script in (deploy / "launch").glob("*.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
    # 1.1.0's LLM-API model reads no gpu_device_ids: the same deployment is a one-line error there.
    recipe_11 = make_recipe(tmp_path, engine={**engine, "trtllm_version": "1.1.0"}, draft=False,
                            deploy={"target": "trtllm", "instance_count": 2})
    engine_11 = build_engine(tmp_path, sources, recipe_11, name="engine-11")
    with pytest.raises(UserError) as err:
        build_deploy(tmp_path, engine_11, recipe_11, name="deploy-11")
    assert "parameters.gpu_device_ids" in err.value.one_line() and "llmapi.md@" in err.value.one_line()


def test_bundle_of_a_removed_backend_is_refused(tmp_path: Path, sources: dict[str, Path]) -> None:
    recipe = make_recipe(tmp_path, draft=False, deploy={"target": "trtllm"})
    engine_dir = build_engine(tmp_path, sources, recipe)
    described = engine_dir / "bundle" / "bundle.json"
    described.write_text(described.read_text().replace('"backend": "pytorch"', '"backend": "tensorrt"'))
    with pytest.raises(BuildError, match="backend 'tensorrt', which trtbuild no longer serves"):
        build_deploy(tmp_path, engine_dir, recipe)


def test_no_draft_pytorch_has_no_speculation(tmp_path: Path, sources: dict[str, Path]) -> None:
    recipe = make_recipe(tmp_path, draft=False)
    engine = build_engine(tmp_path, sources, recipe)
    deploy, result = build_deploy(tmp_path, engine, recipe)
    model_yaml = yaml.safe_load((deploy / "repo_trtllm" / "llm" / "1" / "model.yaml").read_text())
    assert "speculative_config" not in model_yaml
    assert params(parse(deploy / "repo_local" / "llm" / "config.pbtxt"))["speculative"] == "false"
    assert result.metrics["local_speculative"] is False


def test_batch_size_above_engine_is_refused(tmp_path: Path, sources: dict[str, Path]) -> None:
    from trtbuild.deploy.stage import DeployStage

    recipe = make_recipe(tmp_path, deploy={"max_batch_size": 16})
    assert DeployStage().preflight(recipe.deploy, recipe) == [
        "deploy.max_batch_size: 16 exceeds engine.max_batch_size 4 (fix: lower it or raise the engine's)"]
    engine = build_engine(tmp_path, sources, recipe)
    with pytest.raises(UserError, match="deploy.max_batch_size: 16 exceeds the engine's max_batch_size 4"):
        build_deploy(tmp_path, engine, recipe)


def test_schema_check_rejects_bad_configs(tmp_path: Path) -> None:
    good = {"name": "m", "backend": "python", "max_batch_size": 1,
            "input": [{"name": "x", "data_type": Enum("TYPE_STRING"), "dims": [1]}],
            "output": [{"name": "y", "data_type": Enum("TYPE_STRING"), "dims": [1]}]}
    write_config(tmp_path / "ok" / "m", good)
    with pytest.raises(BuildError, match="not a valid Triton ModelConfig.*TYPE_STRNG"):
        bad_input = {"name": "x", "data_type": Enum("TYPE_STRNG"), "dims": [1]}
        write_config(tmp_path / "enum" / "m", {**good, "input": [bad_input]})
    with pytest.raises(BuildError, match="not a valid Triton ModelConfig.*max_batch"):
        write_config(tmp_path / "field" / "m", {**good, "max_batch": 1})
    with pytest.raises(BuildError, match="not a valid Triton ModelConfig"):
        write_config(tmp_path / "type" / "m", {**good, "max_batch_size": "eight"})
    # A template placeholder anywhere is refused, as is a config.pbtxt the server would reject.
    (tmp_path / "ok" / "m" / "1").mkdir()
    (tmp_path / "ok" / "m" / "1" / "model.py").write_text("")
    assert check_repository(tmp_path / "ok") == ["m"]
    (tmp_path / "ok" / "m" / "1" / "model.yaml").write_text("model: ${engine_dir}\n")
    with pytest.raises(BuildError, match=r"unfilled template placeholder \$\{engine_dir\}"):
        check_repository(tmp_path / "ok")
    text = (tmp_path / "ok" / "m" / "config.pbtxt").read_text()
    text = text.replace("max_batch_size: 1", "max_batch_size: ${triton_max_batch_size}")
    (tmp_path / "ok" / "m" / "config.pbtxt").write_text(text)
    with pytest.raises(BuildError, match=r"config.pbtxt:\d+: unfilled template placeholder"):
        check_repository(tmp_path / "ok")
