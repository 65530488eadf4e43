"""`trtbuild serve` / `trtbuild bench --server` entry points on a deploy artifact, with SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest
from deploy_fixtures import build_deploy, build_engine, make_recipe, start_logged, wait_for_line, write_sources

from trtbuild.serve.commands import bench_deployment, default_prompts
from trtbuild.serve.server import group_members

pytestmark = pytest.mark.slow

SERVE = ("import sys; from pathlib import Path; from trtbuild.serve.commands import serve_deployment; "
         "sys.exit(serve_deployment(Path(sys.argv[1]), http_port=0, grpc_port=0, metrics_port=0))")


def test_serve_and_bench_a_deployment(tmp_path: Path) -> None:
    sources = write_sources(tmp_path / "sources")
    recipe = make_recipe(tmp_path, draft=False, deploy={"model_name": "tiny", "local": {"num_threads": 1}})
    engine = build_engine(tmp_path, sources, recipe)
    deploy, _ = build_deploy(tmp_path, engine, recipe)

    proc, lines = start_logged([sys.executable, "-c", SERVE, str(deploy)])
    wait_for_line(proc, lines, "model    tiny")
    text = "".join(lines)
    http = re.search(r"HTTP\s+http://(127\.0\.0\.1:\d+)", text).group(1)
    server_pid = int(re.search(r"ready \(pid (\d+)\)", text).group(1))
    try:
        report = bench_deployment(deploy, http, prompts=default_prompts(2, chars=40), concurrency=(1, 2),
                                  max_tokens=12, out_dir=tmp_path / "bench")
        assert report["model"] == "tiny" and report["outputs_identical"] is True
        assert [row["errors"] for row in report["levels"]] == [0, 0]
        saved = json.loads((tmp_path / "bench" / "bench_server.json").read_text())
        assert saved["levels"][1]["concurrency"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, "".join(lines)
    assert group_members(server_pid) == [] and group_members(proc.pid) == []


def test_model_that_cannot_load_is_a_one_line_error_and_nothing_is_left(tmp_path: Path) -> None:
    from trtbuild.core.errors import BuildError
    from trtbuild.serve.server import TritonServer

    sources = write_sources(tmp_path / "sources")
    recipe = make_recipe(tmp_path, draft=False, deploy={"target": "local"})
    engine = build_engine(tmp_path, sources, recipe)
    deploy, _ = build_deploy(tmp_path, engine, recipe)
    (engine / "bundle" / "target" / "model.safetensors").unlink()  # the bundle lost its weights
    server = TritonServer([deploy / "repo_local"], http_port=0, grpc_port=0, metrics_port=0,
                          log_file=tmp_path / "tritonserver.log")
    message = r"exited with code \d+ while starting: failed to load 'llm' version 1: .*safetensors"
    with pytest.raises(BuildError, match=message):
        server.start(ready_timeout_s=300)
    assert server.pid is None and not server.is_running()
    assert server.last_pid is not None and group_members(server.last_pid) == []


@pytest.mark.parametrize("which", ["triton_http_port", "triton_grpc_port"])
def test_tritonserver_port_taken_before_it_binds_gets_another(tmp_path: Path, which: str) -> None:
    """tritonserver's own ports are picked free, yet another process may take one before it binds
    (CI saw gRPC's): the server starts on fresh ones, the public HTTP and gRPC ports unchanged."""
    import socket
    import urllib.request

    from trtbuild.serve.server import TritonServer

    sources = write_sources(tmp_path / "sources")
    recipe = make_recipe(tmp_path, draft=False, deploy={"target": "local"})
    engine = build_engine(tmp_path, sources, recipe)
    deploy, _ = build_deploy(tmp_path, engine, recipe)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = TritonServer([deploy / "repo_local"], http_port=0, grpc_port=0, metrics_port=0)
        setattr(server, which, taken)
        public = server.endpoints
        try:
            server.start(ready_timeout_s=300)
            assert getattr(server, which) != taken
            assert (server.endpoints.http_port, server.endpoints.grpc_port) == (public.http_port, public.grpc_port)
            with urllib.request.urlopen(f"http://{public.http}/v2/health/ready", timeout=10) as response:
                assert response.status == 200
            if which == "triton_grpc_port":  # the gRPC front relays to the new port
                import tritonclient.grpc as grpcclient

                assert grpcclient.InferenceServerClient(public.grpc).is_server_ready()
        finally:
            assert server.stop() == 0
