"""Launchers of the deploy artifact.

launch/triton_trtllm.sh     (host) runs the Triton TRT-LLM container image named in the recipe on
                            the trtllm repository: GPUs, the bundle mounted read-only at
                            deploy.trtllm.bundle_mount, host ports -> the container's 8000/8001/8002.
launch/start_in_container.sh (inside the image) copies the repository somewhere writable, adds
                            TensorRT-LLM's own model.py files from the image, puts the bundle's
                            GEMM-plugin module on PYTHONPATH (when it has one) and starts one
                            tritonserver: the LLM-API model starts its N ranks itself.
launch/serve_local.sh       (this machine) the local repository on the tritonserver bundled in
                            nvidia-pytriton, bound to 127.0.0.1.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from trtbuild.core.bundle_info import BundleInfo
from trtbuild.core.contract import load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.shell import Raw, comment_safe, default_assignment, env_exports, quote, word
from trtbuild.deploy.config import DeployConfig

CONTAINER_REPO_SRC = "/opt/trtbuild/repo_src"
CONTAINER_LAUNCH = "/opt/trtbuild/launch"
CONTAINER_REPO = "/tmp/trtbuild_repo"
CONTAINER_PORTS = (8000, 8001, 8002)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def tritonserver_argv(exit_timeout_s: int) -> list[str]:
    return ["tritonserver", f"--model-repository={CONTAINER_REPO}", "--disable-auto-complete-config",
            f"--exit-timeout-secs={exit_timeout_s}", f"--http-port={CONTAINER_PORTS[0]}",
            f"--grpc-port={CONTAINER_PORTS[1]}", f"--metrics-port={CONTAINER_PORTS[2]}"]


def container_command(config: Any, trtllm_version: str) -> list[str]:
    """tritonserver as upstream's launch_triton_server.py starts it for the LLM-API model (contract:
    launch_as_root): under `mpirun --allow-run-as-root -n 1` with the python backend's shm-region
    prefix; without mpirun for several instances (upstream's --no-mpi)."""
    root = load_contract(trtllm_version).section("launch_as_root")
    argv = tritonserver_argv(config.exit_timeout_s)
    if root.get("triton_backend_config"):
        argv.append(f"--backend-config={root['triton_backend_config']}")
    single = root.get("triton_single_instance") or []
    if getattr(config, "instance_count", 1) > 1 and not root.get("triton_multi_instance_mpi"):
        single = []
    return [*map(str, single), *argv]


def start_in_container_script(config: Any, bundle: BundleInfo, repo_info: dict[str, Any]) -> str:
    name = repo_info["entry_model"]
    needed = "$ALL_MODELS/llmapi/tensorrt_llm/1/model.py"
    exports = env_exports(bundle.env)
    root_env = load_contract(bundle.trtllm_version).section("launch_as_root").get("env") or {}
    exports += "".join(f'export {k}="${{{k}:-{v}}}"\n' for k, v in sorted(root_env.items()))
    if bundle.python_path:  # the bundle's GEMM-plugin module: its sitecustomize patches TensorRT-LLM's
        # FP8 linears in the python-backend stub and every rank it starts
        module = bundle.mapped(bundle.python_path, config.trtllm.bundle_mount)
        exports += f'export PYTHONPATH={quote(module)}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
    return (
        "#!/usr/bin/env bash\n"
        "# Written by trtbuild. Runs inside the Triton TRT-LLM image (see triton_trtllm.sh).\n"
        "set -euo pipefail\n"
        + default_assignment("TRTBUILD_ALL_MODELS", config.trtllm.all_models_dir)
        + 'ALL_MODELS="$TRTBUILD_ALL_MODELS"\n'
        f"REPO={CONTAINER_REPO}\n"
        f'if [ ! -f "{needed}" ]; then\n'
        f'  echo "error: {needed} not found; set deploy.trtllm.all_models_dir to where this image keeps '
        'TensorRT-LLM\'s triton_backend/all_models" >&2\n'
        "  exit 2\n"
        "fi\n"
        f'rm -rf "$REPO" && cp -r {CONTAINER_REPO_SRC} "$REPO"\n'
        f'cp "$ALL_MODELS/llmapi/tensorrt_llm/1/"*.py "$REPO/{name}/1/"\n'
        + exports
        + "exec " + " ".join(shlex.quote(a) for a in container_command(config, bundle.trtllm_version))
        + ' "$@"\n'
    )


def docker_script(config: DeployConfig, bundle: BundleInfo) -> str:
    """Every recipe value is quoted; ports are published on deploy.trtllm.publish_address only
    (127.0.0.1 unless the recipe opens them wider)."""
    mount = config.trtllm.bundle_mount
    env_flags = "".join(f" -e {k}" for k in sorted(bundle.env))
    http, grpc, metrics = config.http_port, config.grpc_port, config.metrics_port
    address = config.trtllm.publish_address
    host = f"[{address}]" if ":" in address else address
    bundle_volume = word(Raw('"$BUNDLE"'), f":{mount}:ro")
    publish = " ".join(f"-p {quote(f'{host}:{port}:{inner}')}"
                       for port, inner in zip((http, grpc, metrics), CONTAINER_PORTS, strict=True))
    return (
        "#!/usr/bin/env bash\n"
        f"# Written by trtbuild: serves repo_trtllm/ with {comment_safe(config.trtllm.image)}\n"
        f"# on {bundle.world_size} GPU(s). Ports on {comment_safe(address)}: HTTP {http}, gRPC {grpc}, "
        f"metrics {metrics}.\n"
        "# Override the image with TRTBUILD_TRITON_IMAGE, the docker binary with DOCKER.\n"
        "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        'DEPLOY="$(dirname "$HERE")"\n'
        'BUNDLE="$(readlink -f "$DEPLOY/bundle")"\n'
        + default_assignment("TRTBUILD_TRITON_IMAGE", config.trtllm.image)
        + env_exports(bundle.env)
        + 'exec "${DOCKER:-docker}" run --rm --gpus all --ipc=host --shm-size=2g \\\n'
        "  --ulimit memlock=-1 --ulimit stack=67108864 \\\n"
        f"  {publish} \\\n"
        f"  -v {bundle_volume} \\\n"
        f'  -v "$DEPLOY/repo_trtllm:{CONTAINER_REPO_SRC}:ro" \\\n'
        f'  -v "$HERE:{CONTAINER_LAUNCH}:ro" \\\n'
        f"  -e {shlex.quote('TRTBUILD_ALL_MODELS=' + config.trtllm.all_models_dir)}{env_flags} \\\n"
        f'  "$TRTBUILD_TRITON_IMAGE" bash {CONTAINER_LAUNCH}/start_in_container.sh "$@"\n'
    )


def local_script(config: Any) -> str:
    return (
        "#!/usr/bin/env bash\n"
        "# Written by trtbuild: serves repo_local/ on the tritonserver bundled in nvidia-pytriton\n"
        "# (127.0.0.1 only; Ctrl-C drains in-flight requests and stops). Same as `trtbuild serve RECIPE`.\n"
        "# Run it with the project's environment active (or PYTHON=/path/to/.venv/bin/python).\n"
        "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        f'exec "${{PYTHON:-python3}}" -m trtbuild.serve.server "$(dirname "$HERE")/repo_local" '
        f"--http-port {config.http_port} --grpc-port {config.grpc_port} --metrics-port {config.metrics_port} "
        f"--exit-timeout {config.exit_timeout_s} \"$@\"\n"
    )


def write_launchers(out: Path, config: Any, bundle: BundleInfo, trtllm_info: dict[str, Any] | None,
                    local: bool) -> dict[str, str]:
    written = {}
    if trtllm_info is not None:
        start = start_in_container_script(config, bundle, trtllm_info)
        if bundle.python_path:  # the LLM-API model has no import hook of its own (contract: custom_modules)
            contract = load_contract(bundle.trtllm_version)
            cv.raise_first(cv.check_module_environment(
                start, bundle.mapped(bundle.python_path, config.trtllm.bundle_mount), contract,
                "launch/start_in_container.sh", triton=True),
                fix=f"see docs/gpu-path.md (engine.trtllm_version: {contract.version})")
        _write(out / "launch" / "start_in_container.sh", start)
        _write(out / "launch" / "triton_trtllm.sh", docker_script(config, bundle))
        written["trtllm"] = "launch/triton_trtllm.sh"
    if local:
        _write(out / "launch" / "serve_local.sh", local_script(config))
        written["local"] = "launch/serve_local.sh"
    return written
