"""The dynamo target from real engine bundles: the engine args agree with the bundle, the DynamoGraphDeployments
with the CRD facts, the bundle and tp x pp, and every flag the manifests and launchers pass is one the installed
Dynamo 1.6.1 accepts (its frontend parses the frontend's argv for real; dynamo.trtllm's flags are read from the
installed source, since its parser imports tensorrt_llm)."""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import posixpath
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_fixtures import build_deploy, make_recipe, write_sources

from trtbuild.core.bundle_info import read_bundle
from trtbuild.core.contract.dynamo import load_dynamo_contract
from trtbuild.core.errors import UserError
from trtbuild.core.llm_args import read_options
from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.deploy.dynamo import check_graph_deployment
from trtbuild.engine.stage import EngineStage

MOUNT = "/bundle"
GEMM = {"kernels": {"sm_90a": "spatial_partition"}}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_sources(tmp_path_factory.mktemp("sources"))


def installed_flags(*patterns: str) -> set[str]:
    """Every flag (and accepted alias) the installed ai-dynamo's files define."""
    root = Path(str(importlib.metadata.distribution("ai-dynamo").locate_file("")))
    flags: set[str] = set()
    for pattern in patterns:
        for path in root.glob(pattern):
            flags |= {n.value.value for n in ast.walk(ast.parse(path.read_text()))
                      if isinstance(n, ast.keyword) and n.arg in {"flag_name", "obsolete_flag"}
                      and isinstance(n.value, ast.Constant)}
    return flags


def installed_trtllm_flags() -> set[str]:
    return installed_flags("dynamo/trtllm/backend_args.py")


def frontend_accepts(argv: list[str]) -> bool:
    """Every flag is one the installed frontend defines, and Dynamo's own frontend parser takes argv's values
    (argparse checks types and choices as it goes; --help then exits before it would complain of unknown flags)."""
    known = installed_flags("dynamo/frontend/frontend_args.py", "dynamo/common/configuration/groups/*.py")
    assert "--router-mode" in known
    if not {a for a in argv if a.startswith("--")} <= known:
        return False
    return subprocess.run([sys.executable, "-m", "dynamo.frontend", *argv, "--help"], capture_output=True, text=True,
                          timeout=120).returncode == 0


def to_bundle(server_path: str, bundle: Path) -> Path:
    assert posixpath.commonpath([server_path, MOUNT]) == MOUNT, server_path
    return bundle / posixpath.relpath(server_path, MOUNT)


def load(deploy: Path, mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    configmap, dgd = yaml.safe_load_all((deploy / "dynamo" / f"dgd_{mode}.yaml").read_text())
    return configmap, dgd


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def quantized(base: Path, sources: dict[str, Path]) -> Path:
    """The real quantize stage (ModelOpt FP8) on the test target: engine.gemm_plugin needs an FP8 checkpoint."""
    from trtbuild.quantize.stage import QuantizeConfig, QuantizeStage

    out = base / "quantize"
    out.mkdir()
    config = QuantizeConfig.model_validate({
        "calibration": {"num_samples": 8, "seq_len": 32, "batch_size": 8},
        "gate": {"seq_len": 32, "eval_samples": 4, "max_perplexity_ratio": 10.0}})
    QuantizeStage().run(config, StageContext(RecipeInfo.standalone(), {"model": Artifact("model", "k-model",
                                                                                         sources["model"])}, out))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, Path]) -> tuple[Path, Path, Any]:
    base = tmp_path_factory.mktemp("dynamo")
    recipe = make_recipe(base, engine={"tensor_parallel": 2, "pipeline_parallel": 2, "max_batch_size": 6,
                                       "gemm_plugin": GEMM},
                         deploy={"target": ["trtllm", "dynamo"], "model_name": "Tiny_LLM",
                                 "dynamo": {"workers": 3, "prefill_workers": 2, "decode_workers": 1,
                                            "router_mode": "kv"}})
    engine = base / "cache" / "engine" / "engine"
    engine.mkdir(parents=True)
    inputs = {"model": Artifact("model", "k-model", sources["model"]),
              "quantize": Artifact("quantize", "k-q", quantized(base, sources)),
              "draft": Artifact("draft", "k-draft", sources["draft"])}
    EngineStage().run(recipe.engine, StageContext(recipe, inputs, engine, Progress()))
    deploy, _ = build_deploy(base, engine, recipe)
    return deploy, engine / "bundle", recipe


def test_engine_args_are_the_bundles_options_under_the_mount(built: tuple[Path, Path, Any]) -> None:
    deploy, bundle, recipe = built
    options = read_options(bundle / "llm_api_options.yaml").to_dict()
    model_yaml = yaml.safe_load((deploy / "repo_trtllm" / "Tiny_LLM" / "1" / "model.yaml").read_text())

    agg = yaml.safe_load((deploy / "dynamo" / "engine_args" / "agg.yaml").read_text())
    assert "model" not in agg  # the worker's --model names it
    assert set(agg) == set(options) - {"model"}
    assert (agg["tensor_parallel_size"], agg["pipeline_parallel_size"]) == (2, 2)
    draft = to_bundle(agg["speculative_config"]["speculative_model_dir"], bundle)
    assert draft.resolve() == (bundle / options["speculative_config"]["speculative_model_dir"]).resolve()
    assert (draft / "config.json").is_file()
    assert model_yaml["speculative_config"] == agg["speculative_config"]
    disagg = load_dynamo_contract().data["engine_args"]["disaggregated"]
    for role in ("prefill", "decode"):
        args = yaml.safe_load((deploy / "dynamo" / "engine_args" / f"{role}.yaml").read_text())
        assert args == {**agg, **disagg[role]}, role
    # The ConfigMap the pods mount carries exactly these files.
    for mode, roles in (("agg", ["agg"]), ("disagg", ["prefill", "decode"])):
        configmap, _ = load(deploy, mode)
        assert configmap["data"] == {f"{r}.yaml": (deploy / "dynamo" / "engine_args" / f"{r}.yaml").read_text()
                                     for r in roles}


def test_graph_deployments_agree_with_bundle_and_installed_dynamo(built: tuple[Path, Path, Any]) -> None:
    deploy, bundle, recipe = built
    info = read_bundle(bundle)
    contract = load_dynamo_contract()
    trtllm_flags = installed_trtllm_flags()
    assert "--extra-engine-args" in trtllm_flags
    expected = {"agg": [("Frontend", "frontend", 1), ("TRTLLMWorker", "worker", 3)],
                "disagg": [("Frontend", "frontend", 1), ("prefill", "prefill", 2), ("decode", "decode", 1)]}
    for mode, comps in expected.items():
        configmap, dgd = load(deploy, mode)
        assert (dgd["apiVersion"], dgd["kind"]) == ("nvidia.com/v1beta1", "DynamoGraphDeployment")
        assert dgd["metadata"]["name"] == f"tiny-llm-{mode}"
        components = dgd["spec"]["components"]
        assert [(c["name"], c["type"], c["replicas"]) for c in components] == comps
        for comp in components:
            (main,) = comp["podTemplate"]["spec"]["containers"]
            assert main["name"] == "main" and main["image"] == contract.image == recipe.deploy.dynamo.image
            if comp["type"] == "frontend":
                assert main["command"] == ["python3", "-m", "dynamo.frontend"]
                assert frontend_accepts(main["args"]), main["args"]
                continue
            assert main["command"] == ["python3", "-m", "dynamo.trtllm"]
            args = main["args"]
            assert {a for a in args if a.startswith("--")} <= trtllm_flags
            assert main["resources"]["limits"] == {"nvidia.com/gpu": str(info.tensor_parallel * info.pipeline_parallel)}
            assert main["resources"]["limits"]["nvidia.com/gpu"] == "4"
            model = to_bundle(flag_value(args, "--model"), bundle)
            assert model.resolve() == (bundle / info.served).resolve() and (model / "config.json").is_file()
            assert flag_value(args, "--served-model-name") == "Tiny_LLM"
            assert "--publish-kv-events" in args  # router_mode kv
            role = comp["type"] if comp["type"] != "worker" else "agg"
            assert ("--disaggregation-mode" in args) == (role != "agg")
            if role != "agg":
                assert flag_value(args, "--disaggregation-mode") == role
            mounts = {m["name"]: m for m in main["volumeMounts"]}
            engine_args = flag_value(args, "--extra-engine-args")
            assert posixpath.dirname(engine_args) == mounts["engine-args"]["mountPath"]
            assert posixpath.basename(engine_args) in configmap["data"]
            assert mounts["bundle"]["mountPath"] == MOUNT and mounts["bundle"]["readOnly"] is True
            volumes = {v["name"]: v for v in comp["podTemplate"]["spec"]["volumes"]}
            assert volumes["bundle"]["persistentVolumeClaim"]["claimName"] == "trtbuild-bundle"
            assert volumes["engine-args"]["configMap"]["name"] == configmap["metadata"]["name"]
            assert main["envFrom"] == [{"secretRef": {"name": "hf-token-secret"}}]
            env = {e["name"]: e["value"] for e in main["env"]}
            assert info.python_path and (to_bundle(env["PYTHONPATH"], bundle) / "sitecustomize.py").is_file()
        assert check_graph_deployment(dgd, contract, info, "dgd") == []
    assert "&id" not in (deploy / "dynamo" / "dgd_disagg.yaml").read_text()  # no YAML anchors


def test_one_node_launchers(built: tuple[Path, Path, Any]) -> None:
    deploy, bundle, recipe = built
    for script in ("dynamo_node.sh", "dynamo_in_container.sh"):
        subprocess.run(["bash", "-n", str(deploy / "launch" / script)], check=True)
    node = (deploy / "launch" / "dynamo_node.sh").read_text()
    assert '-v "$BUNDLE:/bundle:ro"' in node and "-p 127.0.0.1:8000:8000" in node and recipe.deploy.dynamo.image in node
    inner = (deploy / "launch" / "dynamo_in_container.sh").read_text()
    frontend = next(line for line in inner.splitlines() if "-m dynamo.frontend" in line)
    argv = shlex.split(frontend.split(" & ")[0])[3:]
    assert frontend_accepts(argv), argv
    trtllm_flags = installed_trtllm_flags()
    workers = [line for line in inner.splitlines() if "-m dynamo.trtllm" in line]
    assert len(workers) == 3  # agg, prefill, decode
    for line in workers:
        argv = shlex.split(line.split("python3 -m dynamo.trtllm", 1)[1].split(" & ")[0])
        assert {a for a in argv if a.startswith("--")} <= trtllm_flags
        assert flag_value(argv, "--extra-engine-args").startswith("$ENGINE_ARGS/")
    assert "seq -s, $GPU $((GPU + 4 - 1))" in inner  # tp x pp GPUs per worker
    assert "export PYTHONPATH=/bundle/" in inner
    deploy_json = yaml.safe_load((deploy / "deploy.json").read_text())
    assert deploy_json["launch"]["dynamo"] == "launch/dynamo_node.sh"
    assert deploy_json["dynamo"]["tensorrt_llm_in_image"] == "1.3.0rc29"


def test_frontend_rejects_what_the_contract_does_not_list() -> None:
    """The real parser the checks above lean on fails on a wrong flag or choice (so they can fail)."""
    assert frontend_accepts(["--router-mode", "kv"])
    assert not frontend_accepts(["--router-mode", "fastest"])
    assert not frontend_accepts(["--http-port", "eighty"])
    assert not frontend_accepts(["--no-such-flag"])


def test_schema_check_rejects_bad_manifests(built: tuple[Path, Path, Any]) -> None:
    deploy, bundle, _ = built
    info = read_bundle(bundle)
    contract = load_dynamo_contract()
    _, dgd = load(deploy, "disagg")

    def broken(change: Any) -> list[str]:
        doc = copy.deepcopy(dgd)
        change(doc)
        return [v.line() for v in check_graph_deployment(doc, contract, info, "dgd")]

    comps = "spec"
    cases = {
        "apiVersion": lambda d: d.update(apiVersion="nvidia.com/v1alpha1"),
        "spec.backendFramework": lambda d: d[comps].update(backendFramework="tensorrt"),
        "names must be unique": lambda d: d[comps]["components"][2].update(name="PREFILL"),
        ".name": lambda d: d[comps]["components"][1].update(name="prefill_worker"),
        ".type": lambda d: d[comps]["components"][1].update(type="router"),
        ".services": lambda d: d[comps]["components"][1].update(services={}),
        ".replicas": lambda d: d[comps]["components"][1].update(replicas=-1),
        "containers": lambda d: d[comps]["components"][1]["podTemplate"]["spec"]["containers"][0].update(name="trt"),
        "--model-dir": lambda d: d[comps]["components"][1]["podTemplate"]["spec"]["containers"][0]["args"]
        .append("--model-dir"),
        "nvidia.com/gpu must be": lambda d: d[comps]["components"][2]["podTemplate"]["spec"]["containers"][0]
        ["resources"]["limits"].update({"nvidia.com/gpu": "1"}),
    }
    for needle, change in cases.items():
        lines = broken(change)
        assert len(lines) == 1 and needle in lines[0], (needle, lines)


def test_a_bad_dynamo_option_is_one_line(tmp_path: Path) -> None:
    for bad, field in (({"bundle_claim": "Bundle_PVC"}, "bundle_claim"), ({"bundle_mount": "bundle"}, "bundle_mount"),
                       ({"router_mode": "fastest"}, "router_mode"), ({"workers": 0}, "workers")):
        with pytest.raises(Exception) as err:
            make_recipe(tmp_path, deploy={"target": "dynamo", "dynamo": bad})
        assert field in str(err.value)


def test_disaggregated_engine_args_are_checked(built: tuple[Path, Path, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A transceiver backend upstream's configs do not use is refused in one line, nothing written."""
    from trtbuild.deploy import dynamo as dynamo_deploy

    deploy, bundle, recipe = built
    contract = load_dynamo_contract()
    data = copy.deepcopy(contract.data)
    data["engine_args"]["disaggregated"]["prefill"]["cache_transceiver_config"] = {"backend": "CARRIER_PIGEON"}
    monkeypatch.setattr(dynamo_deploy, "load_dynamo_contract", lambda: type(contract)(contract.version, data, contract.path))
    out = deploy.parent / "bad"
    out.mkdir()
    with pytest.raises(UserError) as err:
        dynamo_deploy.write_dynamo_deployment(out, recipe.deploy, read_bundle(bundle), 6)
    assert "dynamo/engine_args/prefill.yaml:cache_transceiver_config.backend" in err.value.one_line()
    assert not (out / "dynamo" / "dgd_agg.yaml").exists()
