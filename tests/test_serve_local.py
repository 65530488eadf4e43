"""A real Triton Inference Server (the tritonserver bundled in nvidia-pytriton) on the local repository.

One server per module, started the way users start it (`python -m trtbuild.serve.server`, what
`trtbuild serve` runs), serving two models built by the deploy stage from a real engine bundle:
`llm` (decoupled: generate, generate_stream, gRPC streams; speculative decoding with the
bundle's EAGLE-3 draft) and `llm_sync` (plain KServe v2 /infer). Every answer is compared with
plain greedy decoding by the project's runtime, run here in the test process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from deploy_fixtures import build_deploy, build_engine, make_recipe, start_logged, wait_for_line, write_sources

from trtbuild.serve import client
from trtbuild.serve.server import free_port, group_members

pytestmark = pytest.mark.slow

PROMPTS = ["The for statement in Python", "def parse(text):", "Exceptions are raised when",
           "A module is a file containing"]
MAX_TOKENS = 24


class Served:
    def __init__(self, proc: subprocess.Popen[str], http: str, grpc: str, deploy: Path, bundle: Path,
                 log: list[str]) -> None:
        self.proc, self.http, self.grpc, self.log = proc, http, grpc, log
        self.deploy, self.bundle = deploy, bundle
        ready = next(line for line in log if "ready (pid" in line)
        self.server_pid = int(ready.split("pid ")[1].split(")")[0])


def _reference(bundle: Path) -> dict[str, tuple[str, list[int]]]:
    """Plain greedy decoding with the runtime (no draft, no Triton, no trtbuild.deploy code)."""
    from transformers import AutoTokenizer

    from trtbuild.runtime import Generator, load_target

    tokenizer = AutoTokenizer.from_pretrained(str(bundle / "target"))
    generator = Generator(load_target(bundle / "target"))
    out = {}
    for prompt in PROMPTS:
        tokens = generator.generate(tokenizer(prompt)["input_ids"], MAX_TOKENS).tokens
        out[prompt] = (tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False),
                       tokens)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("serve")
    sources = write_sources(base / "sources")
    recipe = make_recipe(base, deploy={"target": "local", "local": {"num_threads": 1}})
    engine = build_engine(base, sources, recipe)
    deploy, _ = build_deploy(base, engine, recipe)
    sync_recipe = make_recipe(base, deploy={"target": "local", "model_name": "llm_sync", "decoupled": False,
                                            "local": {"num_threads": 1}})
    sync_deploy, _ = build_deploy(base, engine, sync_recipe, name="deploy-sync")
    ports = [free_port() for _ in range(3)]
    cmd = [sys.executable, "-m", "trtbuild.serve.server", str(deploy / "repo_local"),
           str(sync_deploy / "repo_local"), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
           "--metrics-port", str(ports[2]), "--exit-timeout", "60"]
    proc, log = start_logged(cmd)
    wait_for_line(proc, log, "ready (pid")
    server = Served(proc, f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}", deploy, engine / "bundle", log)
    yield server
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        os.killpg(server.server_pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(served: Served) -> dict[str, tuple[str, list[int]]]:
    return _reference(served.bundle)


def test_endpoints_printed(served: Served) -> None:
    text = "".join(served.log)
    assert f"http://{served.http}" in text and served.grpc in text
    assert "/v2/models/llm/generate" in text
    meta = requests.get(f"http://{served.http}/v2/models/llm", timeout=10).json()
    assert {t["name"] for t in meta["inputs"]} >= {"text_input", "max_tokens", "stream"}


@pytest.mark.e2e  # `make test` keeps it: a built deployment served by a real tritonserver, HTTP
def test_http_generate_equals_in_process(served: Served, reference: dict) -> None:
    for prompt in PROMPTS:
        answer = client.generate(served.http, "llm", prompt, MAX_TOKENS)
        assert (answer.text, answer.token_ids) == reference[prompt]


@pytest.mark.e2e  # and gRPC streaming
def test_grpc_stream_equals_in_process(served: Served, reference: dict) -> None:
    for prompt in PROMPTS:
        answer = client.stream_grpc(served.grpc, "llm", prompt, MAX_TOKENS)
        assert (answer.text, answer.token_ids) == reference[prompt]
        assert len(answer.pieces) > 1  # streamed, one response per decode step
        assert answer.times == sorted(answer.times)


def test_http_generate_stream_and_kserve_infer(served: Served, reference: dict) -> None:
    prompt = PROMPTS[0]
    streamed = client.generate_stream(served.http, "llm", prompt, MAX_TOKENS)
    assert (streamed.text, streamed.token_ids) == reference[prompt] and len(streamed.pieces) > 1
    plain = client.generate_stream(served.http, "llm", prompt, MAX_TOKENS, speculative=False)
    assert (plain.text, plain.token_ids) == reference[prompt]
    inferred = client.infer(served.http, "llm_sync", prompt, MAX_TOKENS)
    assert (inferred.text, inferred.token_ids) == reference[prompt]


def test_eight_clients_twenty_requests_each(served: Served, reference: dict) -> None:
    def one_client(index: int) -> list[bool]:
        ok = []
        with requests.Session() as session:
            for j in range(20):
                prompt = PROMPTS[(index + j) % len(PROMPTS)]
                answer = client.generate_stream(served.http, "llm", prompt, 8, session=session)
                ok.append(answer.token_ids == reference[prompt][1][:8])
        return ok

    with ThreadPoolExecutor(8) as pool:
        results = [ok for batch in pool.map(one_client, range(8)) for ok in batch]
    assert len(results) == 160 and all(results)


@pytest.mark.parametrize("body, message", [
    ({"max_tokens": 4}, "text_input is required"),
    ({"text_input": "def", "max_tokens": 0}, "max_tokens must be between 1 and 1024, got 0"),
    ({"text_input": "def", "max_tokens": 5000}, "max_tokens must be between 1 and 1024, got 5000"),
    ({"text_input": ["a", "b"]}, "send one prompt per request (got 2)"),
    ({"text_input": ["a", "b"], "max_tokens": 4}, "batch size does not match"),  # Triton's own check
    ({"text_input": "def", "top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    # issue 24 finding 9: checked at the front, before tritonserver's C cast would wrap them
    ({"text_input": "def", "max_tokens": 2**32 + 8}, "max_tokens must be a whole number in [-2147483648, 2147483647]"),
    ({"text_input": "def", "max_tokens": 2**31}, "max_tokens must be a whole number in"),
    ({"text_input": "def", "max_tokens": True}, "max_tokens must be a whole number, got True"),
    ({"text_input": "def", "top_k": 2**32 + 1}, "top_k must be a whole number in"),
])
def test_malformed_request_is_a_clear_4xx(served: Served, reference: dict, body: dict, message: str) -> None:
    response = requests.post(f"http://{served.http}/v2/models/llm/generate", json=body, timeout=60)
    assert 400 <= response.status_code < 500
    assert message in response.json()["error"]
    answer = client.generate(served.http, "llm", PROMPTS[1], MAX_TOKENS)  # still serving
    assert (answer.text, answer.token_ids) == reference[PROMPTS[1]]


def test_bench_server_against_in_process(served: Served, tmp_path: Path) -> None:
    from trtbuild.serve.bench import bench_server, in_process
    from trtbuild.serve.textgen import generator_for_model

    baseline = in_process(generator_for_model(served.deploy / "repo_local" / "llm"))
    report = bench_server(served.http, PROMPTS, (1, 2), model="llm", max_tokens=16, baseline=baseline,
                          out_dir=tmp_path)
    assert report["outputs_identical"] is True
    assert [row["concurrency"] for row in report["levels"]] == [1, 2]
    assert all(row["errors"] == 0 and row["requests"] == len(PROMPTS) for row in report["levels"])
    assert report["levels"][0]["tokens_per_s_per_user"] > 0 and report["levels"][0]["ttft_ms_p50"] > 0
    # The ratio is a speed (bench's job, not a test's): check it is the quotient of the paired runs.
    paired, local = report["paired_c1"]["tokens_per_s_per_user"], report["in_process"]["tokens_per_s_per_user"]
    assert paired > 0 and local > 0 and report["ratio_c1"] == pytest.approx(paired / local)
    saved = json.loads((tmp_path / "bench_server.json").read_text())
    assert saved["ratio_c1"] == report["ratio_c1"]
    assert (tmp_path / "bench_server.png").read_bytes()[:4] == b"\x89PNG"


def test_sigint_drains_in_flight_and_leaves_no_process(served: Served, reference: dict) -> None:
    """Last test of the module: stop the server the way a user does (Ctrl-C) mid-request."""
    long_tokens = 160
    result: dict[str, Any] = {}

    def long_request() -> None:
        try:
            result["answer"] = client.generate_stream(served.http, "llm", PROMPTS[2], long_tokens)
        except Exception as exc:  # recorded and asserted below
            result["error"] = exc

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(1.0)  # the request is being decoded
    os.killpg(served.proc.pid, signal.SIGINT)
    thread.join(timeout=120)
    assert "error" not in result, result.get("error")
    in_process_tokens = _long_reference(served.bundle, PROMPTS[2], long_tokens)
    assert result["answer"].token_ids == in_process_tokens
    assert served.proc.wait(timeout=120) == 0
    log = "".join(served.log)
    assert "draining in-flight requests" in log and "tritonserver stopped (exit code 0)" in log
    assert group_members(served.proc.pid) == [] and group_members(served.server_pid) == []
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{served.http}/v2/health/ready", timeout=5)


def _long_reference(bundle: Path, prompt: str, max_tokens: int) -> list[int]:
    from transformers import AutoTokenizer

    from trtbuild.runtime import Generator, load_target

    tokenizer = AutoTokenizer.from_pretrained(str(bundle / "target"))
    generator = Generator(load_target(bundle / "target"))
    return generator.generate(tokenizer(prompt)["input_ids"], max_tokens).tokens
