"""Launch scripts: valid bash, and the argv and environment they really hand over."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trtbuild.engine import launchers

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")

SPEC = launchers.ServeSpec(model="target", backend="pytorch", tensor_parallel=4, pipeline_parallel=2,
                           expert_parallel=2, env={"TRTLLM_ENABLE_PDL": "1"}, trust_remote_code=True,
                           python_path="trtllm_module")
CLUSTER = launchers.ClusterSpec(nodes=2, gpus_per_node=4, partition="batch", account="proj",
                                container_image="nvcr.io/nvidia/tensorrt-llm/release:1.0.0")


@pytest.mark.parametrize("script", [
    launchers.single_node_script(SPEC), launchers.mpirun_script(SPEC, CLUSTER),
    launchers.slurm_script(SPEC, CLUSTER),
])
def test_scripts_are_valid_bash(tmp_path: Path, script: str) -> None:
    path = tmp_path / "s.sh"
    path.write_text(script)
    done = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _flags(argv: list[str]) -> dict[str, str | None]:
    """--flag value pairs (a flag followed by another flag has value None)."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def _bundle_with_stub(tmp_path: Path, tool: str, script: str) -> tuple[Path, dict[str, str]]:
    """A bundle dir with the script in launch/, and a stand-in `tool` on PATH that records its argv,
    cwd and environment (the real tool is not installable on this host)."""
    bundle = tmp_path / "bundle"
    (bundle / "launch").mkdir(parents=True)
    launch = bundle / "launch" / "run.sh"
    launch.write_text(script)
    launch.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / tool
    stub.write_text('#!/usr/bin/env bash\n{ pwd; echo "PDL=${TRTLLM_ENABLE_PDL:-}"; '
                    'for a in "$@"; do echo "$a"; done; } > "$STUB_OUT"\n')
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", STUB_OUT=str(tmp_path / "argv.txt"))
    return bundle, env


def test_single_node_script_runs_trtllm_serve_from_the_bundle_root(tmp_path: Path) -> None:
    bundle, env = _bundle_with_stub(tmp_path, "trtllm-serve", launchers.single_node_script(SPEC))
    env["TRTBUILD_PORT"] = "9123"
    done = subprocess.run([str(bundle / "launch" / "run.sh"), "--log_level", "debug"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cwd, pdl, *argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert Path(cwd).resolve() == bundle.resolve()  # relative paths in the options resolve here
    assert pdl == "PDL=1"
    assert argv[0] == "./target"
    pairs = _flags(argv)
    assert pairs["--backend"] == "pytorch"
    assert pairs["--port"] == "9123" and pairs["--host"] == "localhost"
    assert (pairs["--tp_size"], pairs["--pp_size"], pairs["--ep_size"]) == ("4", "2", "2")
    assert pairs["--extra_llm_api_options"] == "llm_api_options.yaml"
    assert "--trust_remote_code" in argv
    assert argv[-2:] == ["--log_level", "debug"]


def test_mpirun_script_starts_one_rank_per_gpu(tmp_path: Path) -> None:
    bundle, env = _bundle_with_stub(tmp_path, "mpirun", launchers.mpirun_script(SPEC, CLUSTER))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=4\nnode2 slots=4\n")
    missing = subprocess.run([str(bundle / "launch" / "run.sh")], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "TRTBUILD_HOSTFILE" in missing.stderr
    env["TRTBUILD_HOSTFILE"] = str(hostfile)
    done = subprocess.run([str(bundle / "launch" / "run.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    _, _, *argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv[argv.index("-np") + 1] == "8"  # tp 4 x pp 2
    assert argv[argv.index("--npernode") + 1] == "4"
    assert argv[argv.index("--hostfile") + 1] == str(hostfile)
    launch = argv.index("trtllm-llmapi-launch")
    assert argv[launch + 1:launch + 3] == ["trtllm-serve", "./target"]


def test_slurm_script_directives() -> None:
    text = launchers.slurm_script(SPEC, CLUSTER)
    for directive in ("#SBATCH -N 2", "#SBATCH --ntasks-per-node=4", "#SBATCH -p batch", "#SBATCH -A proj"):
        assert directive in text
    assert "--mpi=pmix" in text and "--container-image nvcr.io/nvidia/tensorrt-llm/release:1.0.0" in text
    assert "trtllm-llmapi-launch trtllm-serve" in text




def test_serve_script_puts_the_plugin_module_first_on_pythonpath(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "launch").mkdir(parents=True)
    script = bundle / "launch" / "serve.sh"
    script.write_text(launchers.single_node_script(SPEC))
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "trtllm-serve").write_text('#!/usr/bin/env bash\necho "PYTHONPATH=$PYTHONPATH"\n')
    (stub / "trtllm-serve").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}", PYTHONPATH="/elsewhere")
    done = subprocess.run([BASH, str(script)], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == f"PYTHONPATH={bundle.resolve()}/trtllm_module:/elsewhere"
    assert "-x PYTHONPATH" in launchers.mpirun_script(SPEC, CLUSTER)
