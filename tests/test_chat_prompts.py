"""Chat prompts end to end: `bench` and the draft evaluation render chat records with the one
function the served OpenAI endpoint uses (trtbuild.core.data.chat), relative bench paths start at the
recipe, and `bench --json` reports errors as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from real_checkpoint import smollm2  # noqa: F401  (the session fixture)

from trtbuild.core.data.chat import record_prompt_ids, request_messages
from trtbuild.core.errors import UserError
from trtbuild.runtime.bench import _prompt_records, load_prompts
from trtbuild.serve.openai_api.text import PromptText

REPO = Path(__file__).resolve().parent.parent
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"},
          {"role": "assistant", "content": "Rayleigh scattering."}]]


def _served_ids(tokenizer, messages, add_special_tokens=True) -> list[int]:
    """What the OpenAI front hands the model: PromptText.chat, then the deployment's encoding."""
    prompts = PromptText(tokenizer, add_special_tokens)
    return tokenizer(prompts.chat(messages), add_special_tokens=add_special_tokens)["input_ids"]


def test_a_recorded_answer_is_not_part_of_the_request():
    assert request_messages(CHATS[1]) == CHATS[1][:2]
    assert request_messages(CHATS[0]) == CHATS[0]


def test_bench_chat_prompts_are_what_the_endpoint_serves(smollm2, tmp_path):  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    # relative to the recipe's directory, whatever the working directory; short prompts allowed
    prompts = load_prompts("chat.jsonl", smollm2, count=2, length=64, base_dir=tmp_path)
    expected = [_served_ids(tokenizer, request_messages(c)) for c in CHATS]
    assert prompts == expected
    assert all(len(p) < 64 for p in prompts)
    text = tokenizer.decode(prompts[0])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_a_template_with_bos_keeps_exactly_one(tmp_path):
    from quantize_fixtures import make_tokenizer

    tokenizer = make_tokenizer()  # its encoder adds <s> itself
    tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                               "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    ids = record_prompt_ids(tokenizer, [CHATS[0]], 1, 64)[0]
    assert ids == _served_ids(tokenizer, CHATS[0])
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id


def test_text_prompts_keep_their_length_rule():
    from quantize_fixtures import make_tokenizer

    tokenizer = make_tokenizer()
    texts = ["short", "a much longer text that certainly has more than eight tokens in it, by far"]
    prompts = record_prompt_ids(tokenizer, texts, 2, 8)
    assert len(prompts) == 1 and len(prompts[0]) == 8


def test_missing_bench_prompts_name_the_resolved_path(tmp_path):
    with pytest.raises(UserError) as err:
        _prompt_records("missing.jsonl", tmp_path)
    assert str(tmp_path / "missing.jsonl") in err.value.one_line()


def test_bench_json_reports_errors_as_json(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nmodel: {source: path, path: nowhere}\nbench: {num_prompts: 0}\n")
    proc = subprocess.run([sys.executable, "-m", "trtbuild.cli", "bench", str(recipe), "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2
    report = json.loads(proc.stdout)
    assert report["status"] == "failed" and "num_prompts" in report["error"]
    assert proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def test_short_chat_evaluation_prompts_validate(tmp_path):
    """Chat prompts are used whole (about ten tokens), so validate's one-prompt length rule for text
    records does not refuse them; the same records as plain text are refused."""
    chats = "".join(json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"}]}) + "\n" for i in range(8))
    (tmp_path / "e.jsonl").write_text(chats)
    (tmp_path / "e.txt").write_text("Question?\n\n" * 8)
    for data, expected in (("e.jsonl", 0), ("e.txt", 2)):
        (tmp_path / "r.yaml").write_text(f"name: r\nmodel: {{source: tiny}}\ndraft:\n  eval:\n    dataset: {data}\n")
        done = subprocess.run([sys.executable, "-m", "trtbuild.cli", "validate", str(tmp_path / "r.yaml")],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == expected, done.stderr[-2000:]
    assert "tokens of one prompt" in done.stderr


@pytest.mark.slow
def test_draft_evaluation_of_a_chat_target_defaults_to_requests_it_writes(smollm2):  # noqa: F811
    """Without draft.eval.dataset, a chat model's draft is measured on requests the target wrote itself
    under the evaluation's own seed, rendered as the served endpoint renders them; not on pydoc, and
    not on the requests its training drew under draft.seed."""
    from transformers import AutoTokenizer

    from trtbuild.draft.config import DraftConfig, DraftEval
    from trtbuild.draft.draft_data import generation_model
    from trtbuild.draft.evaluate import EVAL_REQUEST_SEED, TARGET_WRITTEN, eval_prompts
    from trtbuild.draft.requests import synthesize

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    prompts, origin = eval_prompts(smollm2, DraftEval(prompts=4), None)
    assert origin == TARGET_WRITTEN

    model = generation_model(smollm2)
    defaults = DraftConfig()
    written = synthesize(model, tokenizer, 4, EVAL_REQUEST_SEED, defaults.synthetic_request_tokens)
    assert len(set(written)) == 4
    assert prompts == [_served_ids(tokenizer, [{"role": "user", "content": r}]) for r in written]
    training = synthesize(model, tokenizer, 4, defaults.seed, defaults.synthetic_request_tokens)
    assert not set(training) & set(written)
    # another request seed, another held-out set (bench/draft_eval_spread.py measures tau over several)
    other, _ = eval_prompts(smollm2, DraftEval(prompts=4), None, request_seed=EVAL_REQUEST_SEED + 1)
    assert len(other) == 4 and not {tuple(p) for p in other} & {tuple(p) for p in prompts}
