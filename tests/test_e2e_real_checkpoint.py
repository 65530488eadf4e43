"""End to end on a real third-party checkpoint: SmolLM2-135M-Instruct (bf16, tests/real_checkpoint.py)
through every stage of tests/data/smollm2-chat.yaml with the export check on, deployed, served, and
asked a chat question through the OpenAI endpoint; `bench` on chat prompts.

Slow (minutes on 2 cores: FP8 calibration and a few draft steps on a 135M model); cached in
TRTBUILD_CACHE across runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from real_checkpoint import smollm2  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "tests" / "data" / "smollm2-chat.yaml"


def _trtbuild(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtbuild.cli", *args], env=env, capture_output=True,
                          text=True, cwd=REPO, timeout=3600)


@pytest.fixture(scope="module")
def built(smollm2, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("smollm2-out")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # CI names a cache kept across runs (TRTBUILD_CACHE); without one, a temporary one: never the user's
    env.setdefault("TRTBUILD_CACHE", str(tmp_path_factory.mktemp("cache")))
    sets = ["--set", f"output_dir={out}", "--set", f"model.path={smollm2}"]
    started = time.perf_counter()
    proc = _trtbuild("build", str(RECIPE), *sets, "--json", env=env)
    print(f"build wall {time.perf_counter() - started:.0f} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), env, out, sets


def test_every_stage_builds(built):
    report, _, out, _ = built
    stages = {s["name"]: s for s in report["stages"]}
    assert set(stages) == {"model", "quantize", "draft", "engine", "deploy"}
    assert all(s["status"] in ("ran", "cached") for s in stages.values())
    quantize = stages["quantize"]["metrics"]
    assert quantize["perplexity_ratio"] <= 1.1
    # The export check ran (the recipe keeps the default check_export: true) and judged every layer.
    assert quantize["export_check"] == "passed" and quantize["export_layer_error_median"] < 1e-3
    draft = stages["draft"]["metrics"]
    assert draft["eval_prompts"] == 4 and len(draft["acceptance_rates"]) == 3
    config = json.loads((out / "quantize" / "hf" / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["tie_word_embeddings"] is True
    for name, stage in stages.items():
        print(name, stage["status"], stage.get("seconds"))


def test_served_chat_answers_like_the_model(built):
    from openai import OpenAI

    from trtbuild.serve.commands import local_model_dir, openai_front
    from trtbuild.serve.server import TritonServer

    _, _, out, _ = built
    model_dir, info = local_model_dir(out / "deploy")
    with TritonServer([model_dir.parent], http_port=0, grpc_port=0, metrics_port=0,
                      exit_timeout_s=info.get("exit_timeout_s", 30)) as server, \
            openai_front(model_dir, 0)(server) as front_lines:
        client = OpenAI(base_url=front_lines[0].split()[1], api_key="unused")
        chat = client.chat.completions.create(
            model=info["model_name"], messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0)
    answer = chat.choices[0].message.content
    assert "Paris" in answer, answer


def test_bench_on_chat_prompts_is_lossless(built):
    _, env, _, sets = built
    proc = _trtbuild("bench", str(RECIPE), *sets, "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = json.loads(proc.stdout)
    assert bench["outputs_identical"] is True
    assert bench["prompts"] == 4
    assert bench["speculative"]["steps"] > 0 and bench["ngram"]["steps"] > 0



def test_demo_asks_the_recipes_chat_requests_through_the_template(built):
    """`trtbuild demo` on a chat recipe: the bench's first chat request goes to Triton rendered with the
    chat template and to the OpenAI chat endpoint as messages; both give the model's greedy answer."""
    from trtbuild.runtime.bench import chat_requests
    from trtbuild.serve.commands import demo

    _, _, out, _ = built
    chats = chat_requests("chat_eval.jsonl", RECIPE.parent)
    assert chats[0][-1] == {"role": "user", "content": "What is the capital of France?"}
    lines: list[str] = []
    report = demo(out / "deploy", max_tokens=16, concurrency=(1,), echo=lines.append, out_dir=out / "demo",
                  chats=chats)
    said = {line.split(":", 1)[0].strip(): line.split(":", 1)[1] for line in lines if line[:1] != " " and ":" in line}
    assert "'What is the capital of France?' (through the chat template)" in said["prompt"]
    assert "Paris" in report["demo_answer"]
    assert repr(report["demo_answer"]) in said["openai"]  # the chat endpoint answered the same text
    assert report["outputs_identical"] is True
