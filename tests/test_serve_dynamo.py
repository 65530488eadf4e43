"""`serve --engine dynamo`: NVIDIA Dynamo 1.6.1's real frontend and router in front of worker processes running the
project's runtime. Its answers are the Triton path's (both served here, same deployment, same requests) and the
runtime's own greedy decoding; a SIGKILLed worker costs no later request and comes back; SIGTERM drains and leaves
no process; a SIGKILLed serve leaves none either."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from deploy_fixtures import Reference, build_deploy, build_engine, make_recipe, start_logged, wait_for_line, write_sources

pytest.importorskip("dynamo.frontend")
pytestmark = pytest.mark.slow

SERVE_DYNAMO = ("import sys; from pathlib import Path; from trtbuild.serve.dynamo.server import serve_dynamo_deployment; "
                "sys.exit(serve_dynamo_deployment(Path(sys.argv[1]), workers=int(sys.argv[2]), openai_port=0))")
SERVE_TRITON = ("import sys; from pathlib import Path; from trtbuild.serve.commands import serve_deployment; "
                "sys.exit(serve_deployment(Path(sys.argv[1]), http_port=0, grpc_port=0, metrics_port=0, openai_port=0))")
PROMPTS = ["The for statement in Python", "def parse(text):", "Exceptions are raised when",
           "A module is a file containing"]
MESSAGES = [{"role": "system", "content": "You answer in Python."}, {"role": "user", "content": "How do I open a file?"}]


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


class Dynamo:
    def __init__(self, proc: subprocess.Popen[str], lines: list[str]) -> None:
        self.proc, self.lines = proc, lines
        text = "".join(lines)
        self.url = re.search(r"OpenAI\s+(http://127\.0\.0\.1:\d+/v1)", text).group(1)
        found = re.search(r"dynamo frontend ready \(pid (\d+), \d+ workers: ([\d, ]+)\)", text)
        self.frontend = int(found.group(1))
        self.workers = [int(p) for p in found.group(2).split(", ")]
        self.client = openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)

    def children(self) -> list[int]:
        pids = [self.frontend, *self.workers]
        pids += [int(p) for p in re.findall(r"ready again \(pid (\d+)\)", "".join(self.lines))]
        return pids


def start_dynamo(deploy: Path, workers: int, home: Path) -> Dynamo:
    env = dict(os.environ, HOME=str(home))
    proc = subprocess.Popen([sys.executable, "-c", SERVE_DYNAMO, str(deploy), str(workers)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    wait_for_line(proc, lines, "OpenAI ", timeout_s=600)
    return Dynamo(proc, lines)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("dynamo-serve")
    recipe = make_recipe(base, deploy={"target": "local", "local": {"num_threads": 1}})
    engine = build_engine(base, write_sources(base / "sources"), recipe)
    deploy, _ = build_deploy(base, engine, recipe)
    home = base / "home"
    home.mkdir()
    return deploy, engine / "bundle", home


@pytest.fixture(scope="module")
def dynamo(deployment: tuple[Path, Path, Path]):
    deploy, _, home = deployment
    served = start_dynamo(deploy, 2, home)
    yield served
    if served.proc.poll() is None:
        served.proc.kill()
    for pid in served.children():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def triton(deployment: tuple[Path, Path, Path]):
    """The Triton path on the same deployment: its answers are the reference for Dynamo's."""
    deploy, _, _ = deployment
    proc, lines = start_logged([sys.executable, "-c", SERVE_TRITON, str(deploy)])
    wait_for_line(proc, lines, "OpenAI ", timeout_s=600)
    url = re.search(r"OpenAI\s+(http://127\.0\.0\.1:\d+/v1)", "".join(lines)).group(1)
    yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def reference(deployment: tuple[Path, Path, Path]) -> Reference:
    return Reference(deployment[1])


def completion(client: openai.OpenAI, prompt: str, max_tokens: int, stream: bool = False) -> tuple[str, str, Any]:
    if not stream:
        answer = client.completions.create(model="llm", prompt=prompt, max_tokens=max_tokens, temperature=0)
        return answer.choices[0].text, answer.choices[0].finish_reason, answer.usage
    chunks = list(client.completions.create(model="llm", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                            stream=True))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2  # it did stream
    return "".join(texts), [c.choices[0].finish_reason for c in chunks if c.choices][-1], None


def chat(client: openai.OpenAI, max_tokens: int, stream: bool = False) -> tuple[str, str]:
    if not stream:
        answer = client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=max_tokens, temperature=0)
        assert answer.choices[0].message.role == "assistant"
        return answer.choices[0].message.content, answer.choices[0].finish_reason
    chunks = list(client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=max_tokens,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and len(chunks) > 2
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), \
        [c.choices[0].finish_reason for c in chunks if c.choices][-1]


def test_models_lists_the_deployment(dynamo: Dynamo) -> None:
    assert [m.id for m in dynamo.client.models.list().data] == ["llm"]


def test_completions_equal_the_triton_path_and_greedy_decoding(dynamo: Dynamo, triton: openai.OpenAI,
                                                                reference: Reference) -> None:
    for prompt in PROMPTS[:3]:
        text, reason, usage = completion(dynamo.client, prompt, 20)
        triton_text, triton_reason, _ = completion(triton, prompt, 20)
        assert text == triton_text == reference.complete(prompt, 20)
        assert reason == triton_reason == "length"
        assert usage.prompt_tokens == len(reference.ids(prompt)) and usage.completion_tokens == 20
    streamed, reason, _ = completion(dynamo.client, PROMPTS[3], 24, stream=True)
    assert streamed == completion(triton, PROMPTS[3], 24, stream=True)[0] == reference.complete(PROMPTS[3], 24)
    assert reason == "length"


def test_chat_equals_the_triton_path_and_streams(dynamo: Dynamo, triton: openai.OpenAI, reference: Reference) -> None:
    expected = reference.complete(reference.chat_prompt(MESSAGES), 16)
    assert chat(dynamo.client, 16) == chat(triton, 16) == (expected, "length")
    assert chat(dynamo.client, 16, stream=True) == (expected, "length")


def test_a_killed_worker_costs_no_later_request_and_rejoins(dynamo: Dynamo, reference: Reference) -> None:
    prompt = PROMPTS[1]
    expected = reference.complete(prompt, 12)
    victim = dynamo.workers[0]
    os.kill(victim, signal.SIGKILL)
    while alive(victim):
        time.sleep(0.05)
    answers = [completion(dynamo.client, prompt, 12)[0] for _ in range(8)]  # round-robin would pick it every other time
    assert answers == [expected] * 8
    wait_for_line(dynamo.proc, dynamo.lines, "ready again", timeout_s=300)
    assert f"(pid {victim}) died (killed by SIGKILL)" in "".join(dynamo.lines)
    replacement = int(re.search(r"ready again \(pid (\d+)\)", "".join(dynamo.lines)).group(1))
    assert alive(replacement) and replacement != victim
    answers = [completion(dynamo.client, prompt, 12)[0] for _ in range(6)]
    assert answers == [expected] * 6


def test_sigterm_drains_and_leaves_no_process(dynamo: Dynamo, deployment: tuple[Path, Path, Path],
                                              reference: Reference) -> None:
    _, _, home = deployment
    prompt = PROMPTS[2]
    chunks: list[Any] = []
    stream = dynamo.client.completions.create(model="llm", prompt=prompt, max_tokens=48, temperature=0, stream=True)

    def read() -> None:
        chunks.extend(stream)

    reader = threading.Thread(target=read)
    reader.start()
    while not chunks:
        time.sleep(0.01)
    children = dynamo.children()
    dynamo.proc.send_signal(signal.SIGTERM)
    reader.join(timeout=120)
    assert dynamo.proc.wait(timeout=120) == 0, "".join(dynamo.lines)
    # The request in flight when SIGTERM came was finished, not cut.
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reference.complete(prompt, 48)
    assert "draining" in "".join(dynamo.lines) and "dynamo stopped (exit code 0)" in "".join(dynamo.lines)
    time.sleep(1)
    assert [pid for pid in children if alive(pid)] == []
    assert not (home / ".cache" / "dynamo").exists()  # the tokenizer copy went to the run's own HOME


def test_a_killed_serve_leaves_nothing_running(deployment: tuple[Path, Path, Path]) -> None:
    deploy, _, home = deployment
    served = start_dynamo(deploy, 1, home)
    children = served.children()
    assert all(alive(pid) for pid in children)
    served.proc.kill()
    served.proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in children if alive(pid)] == []
    # What it left on disk goes with the next serve's start.
    from trtbuild.serve.dynamo.server import STATE_PREFIX, remove_stale_state

    left = list(Path(tempfile.gettempdir()).glob(f"{STATE_PREFIX}{served.proc.pid}-*"))
    assert len(left) == 1 and left[0] in remove_stale_state() and not left[0].exists()


def test_bad_worker_count_is_one_line(deployment: tuple[Path, Path, Path]) -> None:
    from trtbuild.core.errors import UserError
    from trtbuild.serve.dynamo.server import serve_dynamo_deployment

    with pytest.raises(UserError, match="at least one worker"):
        serve_dynamo_deployment(deployment[0], workers=0, openai_port=0)
