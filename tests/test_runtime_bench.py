"""`run_bench`: plain, EAGLE-3 and n-gram side by side, JSON + PNG, prompts from the pydoc held-out split."""

from __future__ import annotations

import json

import pytest
from runtime_fixtures import eagle_module_model, export_draft, one_thread  # noqa: F401

from trtbuild.core.errors import UserError
from trtbuild.runtime.bench import BenchConfig, load_prompts, run_bench
from trtbuild.runtime.devmodels import random_llama

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from draft_fixtures import write_tokenizer

    root = tmp_path_factory.mktemp("bench")
    random_llama(root / "target", vocab=384, layers=2)
    write_tokenizer(root / "target")
    export_draft(eagle_module_model(root / "target", draft_vocab=200), root / "eagle3")
    return root / "target", root / "eagle3"


def test_bench_reports_side_by_side_and_writes_json_and_plot(dirs, tmp_path):
    target, draft = dirs
    cfg = BenchConfig(num_prompts=2, prompt_len=24, max_new_tokens=16, max_draft_len=3, topk=2,
                      max_total_draft_tokens=6, warmup=1)
    out = tmp_path / "out" / "bench.json"
    report = run_bench(target, draft, None, cfg, out_path=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    png = out.with_suffix(".png")
    assert report["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain, spec = report["plain"], report["speculative"]
    assert report["outputs_identical"] is True
    assert plain["tokens_per_s_per_user"] > 0 and spec["tokens_per_s_per_user"] > 0
    assert report["speedup"] == pytest.approx(spec["tokens_per_s_per_user"] / plain["tokens_per_s_per_user"])
    assert plain["new_tokens"] == spec["new_tokens"] == 2 * 16
    assert 1.0 <= spec["acceptance_length"] <= 4.0 and len(spec["acceptance_rate_per_position"]) == 3
    assert sum(spec["tokens_per_step_histogram"].values()) == spec["steps"]
    assert spec["ttft_s"] > 0 and spec["profile"]["draft_s"] > 0 and spec["profile"]["target_s"] > 0
    ngram = report["ngram"]  # prompt lookup at the same max_draft_len, same prompts, same run
    assert ngram["new_tokens"] == 2 * 16 and len(ngram["acceptance_rate_per_position"]) == 3
    assert ngram["speedup"] == pytest.approx(ngram["tokens_per_s_per_user"] / plain["tokens_per_s_per_user"])
    assert report["tau_ratio_eagle3_vs_ngram"] == pytest.approx(spec["acceptance_length"] / ngram["acceptance_length"])


def test_bench_without_a_draft_compares_plain_and_ngram(dirs):
    target, _ = dirs
    cfg = BenchConfig(num_prompts=1, prompt_len=24, max_new_tokens=12, max_draft_len=4, warmup=0)
    report = run_bench(target, None, None, cfg)
    assert "speculative" not in report and "speedup" not in report
    assert report["outputs_identical"] is True and report["ngram"]["new_tokens"] == 12
    with pytest.raises(UserError, match="nothing to compare"):
        run_bench(target, None, None, cfg.model_copy(update={"ngram": False}))


def test_prompts_come_from_the_heldout_split(dirs):
    from transformers import AutoTokenizer

    from trtbuild.core.data import pydoc_corpus

    target, _ = dirs
    prompts = load_prompts("pydoc-heldout", target, 3, 20)
    assert len(prompts) == 3 and all(len(p) == 20 for p in prompts)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    heldout = [tokenizer(t)["input_ids"][:20] for t in pydoc_corpus.split()[1]]
    assert all(p in heldout for p in prompts)


def test_prompt_files_and_errors(dirs, tmp_path):
    target, _ = dirs
    text = tmp_path / "prompts.txt"
    text.write_text("first paragraph with enough words in it to be long\n\nsecond one also long enough ok")
    assert len(load_prompts(str(text), target, 5, 4)) == 2
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "a prompt that is long enough"}\nnot json\n')
    with pytest.raises(UserError, match="prompt") as err:
        load_prompts(str(jsonl), target, 1, 2)
    assert err.value.line == 2
    with pytest.raises(UserError, match="not found"):
        load_prompts(str(tmp_path / "missing.txt"), target, 1, 2)
    with pytest.raises(UserError, match="prompt_len"):
        load_prompts(str(text), target, 1, 10_000)
