"""Launchers of the deploy artifact.

launch/triton_trtllm.sh     (host) runs the Triton TRT-LLM container image named in the recipe on
                            the trtllm repository: GPUs, the bundle mounted read-only at
                            deploy.trtllm.bundle_mount, host ports -> the container's 8000/8001/8002
                            (TensorRT-LLM's BLS model calls the gRPC endpoint at localhost:8001).
launch/start_in_container.sh (inside the image) copies the repository somewhere writable, adds
                            TensorRT-LLM's own model.py files from the image, and starts tritonserver:
                            one process, or for backend tensorrt with world size N > 1 N ranks under
                            `mpirun -n 1 ... : -n 1 ...` (rank 0 serves; the others load only
                            tensorrt_llm), as TensorRT-LLM's scripts/launch_triton_server.py does.
                            The LLM-API model (backend pytorch) starts its N ranks itself, so one
                            tritonserver serves all GPUs.
launch/serve_local.sh       (this machine) the local repository on the tritonserver bundled in
                            nvidia-pytriton, bound to 127.0.0.1.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from trtbuild.shell import Raw, comment_safe, default_assignment, env_exports, quote, word
from trtbuild.triton.bundle_info import BundleInfo

CONTAINER_REPO_SRC = "/opt/trtbuild/repo_src"
CONTAINER_LAUNCH = "/opt/trtbuild/launch"
CONTAINER_REPO = "/tmp/trtbuild_repo"
CONTAINER_PORTS = (8000, 8001, 8002)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def tritonserver_argv(rank: int, world: int, trtllm_model: str, exit_timeout_s: int) -> list[str]:
    argv = ["tritonserver", f"--model-repository={CONTAINER_REPO}", "--disable-auto-complete-config",
            f"--exit-timeout-secs={exit_timeout_s}",
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
    if rank == 0:
        argv += [f"--http-port={CONTAINER_PORTS[0]}", f"--grpc-port={CONTAINER_PORTS[1]}",
                 f"--metrics-port={CONTAINER_PORTS[2]}"]
    else:
        argv += ["--model-control-mode=explicit", f"--load-model={trtllm_model}",
                 "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
    return argv


def server_command(bundle: BundleInfo, trtllm_model: str, exit_timeout_s: int) -> list[str]:
    world = bundle.world_size if bundle.backend == "tensorrt" else 1
    if world == 1:
        return tritonserver_argv(0, 1, trtllm_model, exit_timeout_s)
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world):
        if rank:
            argv.append(":")
        argv += ["-n", "1", *tritonserver_argv(rank, world, trtllm_model, exit_timeout_s)]
    return argv


def start_in_container_script(config: Any, bundle: BundleInfo, repo_info: dict[str, Any]) -> str:
    all_models = config.trtllm.all_models_dir
    copies = []
    if repo_info["kind"] == "llmapi":
        name = repo_info["entry_model"]
        copies.append(f'cp "$ALL_MODELS/llmapi/tensorrt_llm/1/"*.py "$REPO/{name}/1/"')
        trtllm_model = name
        needed = "$ALL_MODELS/llmapi/tensorrt_llm/1/model.py"
    else:
        for name in ("preprocessing", "postprocessing"):
            copies.append(f'cp "$ALL_MODELS/inflight_batcher_llm/{name}/1/model.py" "$REPO/{name}/1/"')
        if "tensorrt_llm_bls" in repo_info["models"]:
            copies.append('cp -r "$ALL_MODELS/inflight_batcher_llm/tensorrt_llm_bls/1/." '
                          '"$REPO/tensorrt_llm_bls/1/"')
        trtllm_model = "tensorrt_llm"
        needed = "$ALL_MODELS/inflight_batcher_llm/preprocessing/1/model.py"
    command = server_command(bundle, trtllm_model, config.exit_timeout_s)
    exports = env_exports(bundle.env)
    return (
        "#!/usr/bin/env bash\n"
        "# Written by trtbuild. Runs inside the Triton TRT-LLM image (see triton_trtllm.sh).\n"
        "set -euo pipefail\n"
        + default_assignment("TRTBUILD_ALL_MODELS", all_models)
        + 'ALL_MODELS="$TRTBUILD_ALL_MODELS"\n'
        f"REPO={CONTAINER_REPO}\n"
        f'if [ ! -f "{needed}" ]; then\n'
        f'  echo "error: {needed} not found; set deploy.trtllm.all_models_dir to where this image keeps '
        'TensorRT-LLM\'s triton_backend/all_models" >&2\n'
        "  exit 2\n"
        "fi\n"
        f'rm -rf "$REPO" && cp -r {CONTAINER_REPO_SRC} "$REPO"\n'
        + "".join(line + "\n" for line in copies)
        + exports
        + "exec " + " ".join(shlex.quote(a) for a in command) + ' "$@"\n'
    )


def docker_script(config: Any, bundle: BundleInfo) -> str:
    """Every recipe value is quoted; ports are published on deploy.trtllm.publish_address only
    (127.0.0.1 unless the recipe opens them wider)."""
    mount = config.trtllm.bundle_mount
    env_flags = "".join(f" -e {k}" for k in sorted(bundle.env))
    http, grpc, metrics = config.http_port, config.grpc_port, config.metrics_port
    address = getattr(config.trtllm, "publish_address", "127.0.0.1")
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
        f'exec "${{PYTHON:-python3}}" -m trtbuild.triton.server "$(dirname "$HERE")/repo_local" '
        f"--http-port {config.http_port} --grpc-port {config.grpc_port} --metrics-port {config.metrics_port} "
        f"--exit-timeout {config.exit_timeout_s} \"$@\"\n"
    )


def write_launchers(out: Path, config: Any, bundle: BundleInfo, trtllm_info: dict[str, Any] | None,
                    local: bool) -> dict[str, str]:
    written = {}
    if trtllm_info is not None:
        start = start_in_container_script(config, bundle, trtllm_info)
        _write(out / "launch" / "start_in_container.sh", start)
        _write(out / "launch" / "triton_trtllm.sh", docker_script(config, bundle))
        written["trtllm"] = "launch/triton_trtllm.sh"
    if local:
        _write(out / "launch" / "serve_local.sh", local_script(config))
        written["local"] = "launch/serve_local.sh"
    return written
