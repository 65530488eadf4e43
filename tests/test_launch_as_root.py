"""Issue 37.4: the launchers start TensorRT-LLM as upstream does inside its containers, which run as root.

Open MPI refuses root unless mpirun gets --allow-run-as-root or OMPI_ALLOW_RUN_AS_ROOT=1 and
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set (contract: launch_as_root, open-mpi/ompi#6911). The Triton LLM-API
model is started as upstream's launch_triton_server.py starts it and the release's backend docs tell users
to: `mpirun --allow-run-as-root -n 1 tritonserver ... --backend-config=python,shm-region-prefix-name=prefix0_`
(`--no-mpi` for several instances). The scripts run here against stand-ins that record argv and environment.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from trtbuild.app.recipe import load_recipe
from trtbuild.core.bundle_info import BundleInfo
from trtbuild.core.contract import load_contract
from trtbuild.deploy.launch import start_in_container_script
from trtbuild.engine import launchers
from trtbuild.engine.conformance import serve_spec

ROOT = Path(__file__).resolve().parents[1]
RECIPE_8B = ROOT / "recipes" / "llama-3.1-8b-instruct-fp8-eagle3.yaml"
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _recipe(version: str, *sets: str):  # type: ignore[no-untyped-def]
    image = load_contract(version).section("release").get("triton_image") or "registry.example/trtllm:main"
    return load_recipe(RECIPE_8B, [f"engine.trtllm_version={version}", f"deploy.trtllm.image={image}", *sets])


def _run(tmp_path: Path, tool: str, script: str, env: dict[str, str] | None = None) -> tuple[list[str], dict]:
    """Run `script` with a stand-in `tool` on PATH that records its argv and the Open MPI root variables."""
    bundle = tmp_path / "bundle"
    (bundle / "launch").mkdir(parents=True)
    run = bundle / "launch" / "run.sh"
    run.write_text(script)
    run.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / tool).write_text('#!/usr/bin/env bash\n{ for k in OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM; '
                                'do echo "$k=${!k:-unset}"; done; for a in "$@"; do echo "$a"; done; } > "$OUT"\n')
    (bin_dir / tool).chmod(0o755)
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=8\nb slots=8\n")
    full = {k: v for k, v in os.environ.items() if k not in ROOT_ENV}
    full.update(PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out.txt"), TRTBUILD_HOSTFILE=str(hosts),
                **(env or {}))
    done = subprocess.run([str(run)], env=full, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "out.txt").read_text().splitlines()
    return lines[2:], dict(line.split("=", 1) for line in lines[:2])


@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
def test_trtllm_serve_launchers_run_as_root(tmp_path: Path, version: str) -> None:
    recipe = _recipe(version)
    contract = load_contract(version)
    spec = serve_spec(recipe.engine, recipe, contract, served="target")
    root = contract.section("launch_as_root")
    assert spec.root_env == root["env"] == ROOT_ENV and spec.mpirun_flags == ("--allow-run-as-root",)

    argv, env = _run(tmp_path / "mpi", "mpirun", launchers.mpirun_script(spec, launchers.ClusterSpec(nodes=2,
                                                                                                     gpus_per_node=8)))
    assert argv[0] == "--allow-run-as-root" and env == ROOT_ENV
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert set(ROOT_ENV) <= set(exported)  # every rank on every node gets them
    assert argv[argv.index("trtllm-llmapi-launch") + 1] == "trtllm-serve"

    # One node: trtllm-serve spawns its MPI workers itself; the variables reach them.
    _, env = _run(tmp_path / "one", "trtllm-serve", launchers.single_node_script(spec))
    assert env == ROOT_ENV
    # A value the operator set wins.
    _, env = _run(tmp_path / "own", "trtllm-serve", launchers.single_node_script(spec),
                  {"OMPI_ALLOW_RUN_AS_ROOT": "0"})
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "0"
    assert "export OMPI_ALLOW_RUN_AS_ROOT=" in launchers.slurm_script(spec, launchers.ClusterSpec(nodes=2))


def _exec_line(script: str) -> list[str]:
    (line,) = [line for line in script.splitlines() if line.startswith("exec ")]
    return shlex.split(line)[1:]


@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
def test_triton_starts_as_upstreams_launch_triton_server(version: str) -> None:
    recipe = _recipe(version)
    bundle = BundleInfo(root=ROOT, backend="pytorch", served="target", tokenizer="target", draft="draft",
                        options=None, env={}, trtllm_version=version, python_path="trtllm_module")
    script = start_in_container_script(recipe.deploy, bundle, {"entry_model": recipe.deploy.model_name})
    argv = _exec_line(script)
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "tritonserver"]
    assert "--backend-config=python,shm-region-prefix-name=prefix0_" in argv
    assert "--disable-auto-complete-config" in argv and argv[-1] == "$@"
    for key, value in ROOT_ENV.items():
        assert f'export {key}="${{{key}:-{value}}}"' in script
    fact = load_contract(version).fact(load_contract(version).section("launch_as_root")["doc_source"])
    assert "docs/llmapi.md@" in fact


def test_several_triton_instances_start_without_mpirun() -> None:
    """Upstream: multi-instance LLM-API models (gpu_device_ids) start with --no-mpi (1.2.1's backend docs)."""
    recipe = _recipe("1.2.1", "deploy.instance_count=2")
    bundle = BundleInfo(root=ROOT, backend="pytorch", served="target", tokenizer="target", draft="draft",
                        options=None, env={}, trtllm_version="1.2.1", python_path=None)
    argv = _exec_line(start_in_container_script(recipe.deploy, bundle, {"entry_model": recipe.deploy.model_name}))
    assert argv[0] == "tritonserver" and "mpirun" not in argv
    assert "--backend-config=python,shm-region-prefix-name=prefix0_" in argv
