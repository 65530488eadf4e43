"""Issue 24 finding 1 under a real server: 4 concurrent greedy requests are unaffected by hostile
ones sent with them. Before: `temperature: 1e-40` overflowed the logits to NaN and the failed step
answered all 4 with 500, and one prompt whose ids (from a tokenizer that does not match the model)
exceed the target's vocabulary did the same. Now the temperature decodes greedily (below the 1e-5
epsilon) and the out-of-vocabulary prompt is refused alone with a 400; the 4 get exactly the text
they get when sent alone. A real tritonserver, started as `trtbuild serve` starts it."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from deploy_fixtures import VOCAB, build_deploy, build_engine, make_recipe, write_sources
from draft_fixtures import write_tokenizer
from test_serve_hardening import GENERATE, Served

pytestmark = pytest.mark.slow
WIDE_VOCAB = 1000  # the mismatched tokenizer: ids up to 999 for a target of VOCAB (384)
CANDIDATES = ["abc", "ABC", "x.y()", "abcabc", "(x, y)", "a(b)", "xyz", "cab", "def parse(text):",
              "import collections", "return self.items", "class Queue:", "hello world"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("isolation-serve")
    sources = write_sources(base / "sources")
    write_tokenizer(base / "wide-tokenizer", vocab_size=WIDE_VOCAB)
    recipe = make_recipe(base, draft=False, engine={"max_batch_size": 8}, deploy={"target": "local", "max_batch_size": 8,
                                                    "local": {"num_threads": 1},
                                                    "tokenizer": {"path": str(base / "wide-tokenizer")}})
    engine = build_engine(base, sources, recipe)
    deploy = build_deploy(base, engine, recipe)[0]
    server = Served(deploy, exit_timeout=10)
    yield server, base / "wide-tokenizer"
    os.kill(server.proc.pid, signal.SIGINT)
    try:
        server.proc.wait(timeout=60)
    finally:
        server.kill()


def _post(server: Served, body: dict) -> tuple[int, dict]:
    response = server.post(GENERATE, json.dumps(body), timeout=120)
    return response.status_code, response.json()


def test_four_greedy_requests_unaffected_by_hostile_ones(served) -> None:
    from transformers import AutoTokenizer

    server, tokenizer_dir = served
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = {text: tokenizer(text)["input_ids"] for text in CANDIDATES}
    fitting = [t for t in CANDIDATES if max(ids[t]) < VOCAB][:4]
    beyond = next(t for t in CANDIDATES if max(ids[t]) >= VOCAB)
    assert len(fitting) == 4
    greedy = [{"text_input": t, "max_tokens": 24} for t in fitting]
    solo = [_post(server, body) for body in greedy]
    assert all(status == 200 for status, _ in solo), solo
    hostile = [{"text_input": fitting[0], "max_tokens": 24, "temperature": 1e-40, "seed": 1},
               {"text_input": fitting[1], "max_tokens": 24, "temperature": 1e-45},
               {"text_input": beyond, "max_tokens": 24}]
    for _ in range(2):  # the hostile ones arrive with the greedy ones, and once more while they decode
        with ThreadPoolExecutor(len(greedy) + len(hostile)) as pool:
            futures = [pool.submit(_post, server, body) for body in greedy + hostile]
            results = [f.result() for f in futures]
        assert results[: len(greedy)] == solo
        (t40, b40), (t45, b45), (tv, bv) = results[len(greedy):]
        assert (t40, b40["text_output"]) == (200, solo[0][1]["text_output"])  # decoded greedily
        assert (t45, b45["text_output"]) == (200, solo[1][1]["text_output"])
        assert tv == 400 and f"outside the model's vocabulary [0, {VOCAB})" in bv["error"], bv
    assert [_post(server, body) for body in greedy] == solo  # and the server serves on
