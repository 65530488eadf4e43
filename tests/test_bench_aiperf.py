"""`bench --server`: AIPerf (its own environment, `make aiperf`) against `trtbuild serve`'s OpenAI API.

A real deployment served on free ports (Triton + the OpenAI front), two short AIPerf levels, the
report's rows read from AIPerf's own JSON export, and the in-process figures beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deploy_fixtures import build_deploy, build_engine, make_recipe, write_sources

from trtbuild.serve.commands import bench_local, bench_server_url
from trtbuild.serve.loadgen.aiperf import find_aiperf, levels
from trtbuild.serve.loadgen.report import rows

pytestmark = pytest.mark.slow

PROMPTS = ["The for statement in Python", "def parse(text):", "Exceptions are raised when"]


@pytest.fixture(scope="module")
def deploy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_aiperf() is None:
        pytest.fail("AIPerf is not installed: `make aiperf` (make test does it) or set TRTBUILD_AIPERF")
    base = tmp_path_factory.mktemp("aiperf")
    recipe = make_recipe(base, deploy={"target": "local", "local": {"num_threads": 1}})
    engine = build_engine(base, write_sources(base / "sources"), recipe)
    return build_deploy(base, engine, recipe)[0]


def test_aiperf_levels_against_the_openai_front(deploy: Path, tmp_path: Path) -> None:
    from trtbuild.serve import commands

    report = bench_local(deploy, concurrency=(1, 2), max_tokens=8, out_dir=tmp_path, echo=lambda _: None)
    asked = {level.concurrency: level.requests for level in levels((1, 2))}
    assert report["loadgen"] == "aiperf" and report["model"] == "llm"
    assert [row["concurrency"] for row in report["levels"]] == [1, 2]
    for row in report["levels"]:
        export = json.loads((tmp_path / "aiperf" / f"c{row['concurrency']}" / "profile_export_aiperf.json").read_text())
        assert row["errors"] == 0 and row["requests"] == asked[row["concurrency"]] == export["request_count"]["avg"]
        assert row["ttft_ms_p50"] == export["time_to_first_token"]["p50"] > 0
        assert row["throughput_tokens_per_s"] == export["output_token_throughput"]["avg"] > 0
        assert export["output_sequence_length"]["avg"] <= 8 and "--concurrency" in row["command"]
    assert report["in_process"]["requests"] == min(8, len(commands.default_prompts(32)))
    assert report["criteria"] == {}  # no level 8 or 32 in this short run
    saved = json.loads((tmp_path / "bench_server.json").read_text())
    assert saved["levels"] == report["levels"] and (tmp_path / "bench_server.png").is_file()
    assert rows(report)[-1][0] == "in-process"


def test_server_argument_is_checked(deploy: Path, tmp_path: Path) -> None:
    from trtbuild.core.errors import UserError

    with pytest.raises(UserError, match="speaks Triton's generate_stream"):
        bench_server_url(deploy, "http://127.0.0.1:9/v1", loadgen="builtin")
    with pytest.raises(UserError, match="no OpenAI model list"):
        bench_server_url(deploy, "http://127.0.0.1:9/v1", out_dir=tmp_path)
