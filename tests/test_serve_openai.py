"""The OpenAI-compatible API of `trtbuild serve`, driven by the official `openai` Python client.

One real deployment (deploy stage on a real engine bundle: random Llama + EAGLE-3 draft, local
model batching 4 requests in flight) served the way `trtbuild serve` serves it, in a subprocess.
Greedy answers are compared with plain greedy decoding by the runtime in this process, on the
prompt the chat template renders; errors must come back in OpenAI's error format.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from deploy_fixtures import Reference, build_deploy, build_engine, make_recipe, start_logged, wait_for_line, write_sources

from trtbuild.serve.server import group_members

pytestmark = pytest.mark.slow

SERVE = ("import sys; from pathlib import Path; from trtbuild.serve.commands import serve_deployment; "
         "sys.exit(serve_deployment(Path(sys.argv[1]), http_port=0, grpc_port=0, metrics_port=0, openai_port=0))")
PROMPTS = ["The for statement in Python", "def parse(text):", "Exceptions are raised when",
           "A module is a file containing"]


class Served:
    def __init__(self, proc: subprocess.Popen[str], lines: list[str], bundle: Path) -> None:
        self.proc, self.lines, self.bundle = proc, lines, bundle
        text = "".join(lines)
        self.url = re.search(r"OpenAI\s+(http://127\.0\.0\.1:\d+/v1)", text).group(1)
        self.server_pid = int(re.search(r"ready \(pid (\d+)\)", text).group(1))
        self.client = openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("openai")
    recipe = make_recipe(base, deploy={"target": "local", "local": {"num_threads": 1}})
    engine = build_engine(base, write_sources(base / "sources"), recipe)
    deploy, _ = build_deploy(base, engine, recipe)
    proc, lines = start_logged([sys.executable, "-c", SERVE, str(deploy)])
    wait_for_line(proc, lines, "OpenAI ")
    server = Served(proc, lines, engine / "bundle")
    yield server
    if proc.poll() is None:
        proc.kill()
        subprocess.run(["kill", "-9", f"-{server.server_pid}"], check=False)


@pytest.fixture(scope="module")
def reference(served: Served) -> Reference:
    return Reference(served.bundle)


def test_models_lists_the_deployment(served: Served) -> None:
    models = served.client.models.list().data
    assert [m.id for m in models] == ["llm"] and models[0].object == "model"


def test_completions_equal_greedy_decoding(served: Served, reference: Reference) -> None:
    for prompt in PROMPTS[:2]:
        answer = served.client.completions.create(model="llm", prompt=prompt, max_tokens=20, temperature=0)
        choice = answer.choices[0]
        assert choice.text == reference.complete(prompt, 20) and choice.finish_reason == "length"
        assert answer.usage.prompt_tokens == len(reference.ids(prompt)) and answer.usage.completion_tokens == 20
        assert answer.usage.total_tokens == answer.usage.prompt_tokens + 20 and answer.object == "text_completion"


def test_streamed_completion_concatenates_to_the_answer(served: Served, reference: Reference) -> None:
    prompt = PROMPTS[2]
    chunks = list(served.client.completions.create(model="llm", prompt=prompt, max_tokens=24, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2 and "".join(texts) == reference.complete(prompt, 24)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_chat_uses_the_template_and_streams(served: Served, reference: Reference) -> None:
    messages = [{"role": "system", "content": "You answer in Python."},
                {"role": "user", "content": "How do I open a file?"}]
    rendered = reference.chat_prompt(messages)
    expected = reference.complete(rendered, 16)
    answer = served.client.chat.completions.create(model="llm", messages=messages, max_tokens=16, temperature=0)
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].message.content == expected
    assert answer.usage.prompt_tokens == len(reference.ids(rendered)) and answer.object == "chat.completion"
    stream = served.client.chat.completions.create(model="llm", messages=messages, max_completion_tokens=16,
                                                   temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_sequence_cuts_the_text_and_ends_the_request(served: Served, reference: Reference) -> None:
    prompt = PROMPTS[3]
    full = reference.complete(prompt, 40)
    stop = full[9:12]  # three characters from inside the answer
    assert stop
    cut = full[: full.index(stop)]
    for stream in (False, True):
        answer = served.client.completions.create(model="llm", prompt=prompt, max_tokens=40, temperature=0,
                                                  stop=[stop, "never appears"], stream=stream)
        chunks = list(answer) if stream else [answer]
        assert "".join(c.choices[0].text for c in chunks) == cut
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(served: Served) -> None:
    def sample(seed: int) -> str:
        return served.client.completions.create(model="llm", prompt=PROMPTS[0], max_tokens=12, temperature=1.0,
                                                top_p=0.9, seed=seed).choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(5)}) > 1


def test_eight_concurrent_streams_are_each_exact(served: Served, reference: Reference) -> None:
    """More clients than the model's batch of 4: requests queue, join the batch as others leave."""
    prompts = [PROMPTS[i % 4] + " " * (i // 4) for i in range(8)]

    def one(prompt: str) -> str:
        stream = served.client.completions.create(model="llm", prompt=prompt, max_tokens=16, temperature=0,
                                                  stream=True)
        return "".join(c.choices[0].text for c in stream)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, prompts))
    assert answers == [reference.complete(p, 16) for p in prompts]


def _error(exc_info: Any) -> dict[str, Any]:
    body = exc_info.value.body
    assert set(body) == {"message", "type", "param", "code"}, body
    return body


@pytest.mark.parametrize("kwargs, param, message", [
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"temperature": 3.0}, "temperature", "less than or equal to 2"),
    ({"n": 2}, "n", "got 2"),
    ({"extra_body": {"best_of_n": 3}}, "best_of_n", "unrecognized request argument"),
    ({"max_tokens": 5000}, None, "max_tokens must be between 1 and 1024, got 5000"),  # the model's own check
])
def test_malformed_completion_is_an_openai_400(served: Served, kwargs: dict, param: str | None,
                                               message: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.completions.create(model="llm", prompt="def", **kwargs)
    body = _error(caught)
    assert caught.value.status_code == 400 and body["type"] == "invalid_request_error"
    assert body["param"] == param and message in body["message"]


def test_unknown_model_and_broken_bodies(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        served.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert _error(caught)["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.chat.completions.create(model="llm", messages=[])
    assert _error(caught)["param"] == "messages"
    raw = requests.post(f"{served.url}/completions", data=b"{not json", timeout=30,
                     headers={"Content-Type": "application/json"})
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    missing = requests.get(f"{served.url}/nothing-here", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_documented_client_snippet_works_unchanged(served: Served, reference: Reference) -> None:
    """scripts/openai_client.py (shown in docs/serving.md) against this server, configured only
    through OPENAI_BASE_URL, prints the greedy chat answer."""
    import os

    root = Path(__file__).resolve().parent.parent
    script = root / "scripts" / "openai_client.py"
    assert script.read_text().strip() in (root / "docs" / "serving.md").read_text()
    env = {**os.environ, "OPENAI_BASE_URL": served.url}
    env.pop("OPENAI_API_KEY", None)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    messages = [{"role": "user", "content": "What does the for statement do?"}]
    assert out.stdout == reference.complete(reference.chat_prompt(messages), 32) + "\n"


def test_sigterm_stops_front_and_server_cleanly(served: Served) -> None:
    """Last: a streamed request in flight finishes, then everything exits."""
    result: dict[str, Any] = {}

    def long_request() -> None:
        stream = served.client.completions.create(model="llm", prompt=PROMPTS[0], max_tokens=120,
                                                  temperature=0, stream=True)
        result["text"] = "".join(c.choices[0].text for c in stream)

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(1.0)
    served.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=120)
    assert served.proc.wait(timeout=120) == 0, "".join(served.lines)
    assert len(result.get("text", "")) > 0
    assert group_members(served.server_pid) == [] and group_members(served.proc.pid) == []
