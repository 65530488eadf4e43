"""Chat requests the target writes itself (trtbuild.draft.requests) and the draft data they feed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draft_fixtures import write_target
from pydantic import ValidationError

from trtbuild.core.progress import Progress
from trtbuild.draft import shards

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = write_target(tmp_path_factory.mktemp("target") / "hf")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _model_and_tokenizer(target: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from trtbuild.draft.data import load_target

    return load_target(target), AutoTokenizer.from_pretrained(str(target))


@pytest.mark.parametrize("templated", [True, False])
def test_the_prefix_is_the_served_request_up_to_its_content(target: Path, templated: bool) -> None:
    from trtbuild.core.data.chat import chat_prompt_ids
    from trtbuild.draft.requests import user_turn_prefix

    _, tokenizer = _model_and_tokenizer(target)
    if not templated:
        tokenizer.chat_template = None  # the fallback "role: content" transcript
    prefix = user_turn_prefix(tokenizer)
    served = chat_prompt_ids(tokenizer, [{"role": "user", "content": "\n\nwhere is it"}])
    assert served[: len(prefix)] == prefix and len(served) > len(prefix)
    assert tokenizer.decode(prefix).endswith("<|user|>\n" if templated else "user: ")


def test_requests_are_distinct_and_seeded(target: Path) -> None:
    from trtbuild.draft.requests import end_of_turn_ids, synthesize

    model, tokenizer = _model_and_tokenizer(target)
    stops = end_of_turn_ids(model, tokenizer)
    assert tokenizer.eos_token_id in stops
    first = synthesize(model, tokenizer, 12, seed=3, max_tokens=12)
    assert len(first) == 12 == len(set(first)) and all(r and r == r.strip() for r in first)
    assert synthesize(model, tokenizer, 12, seed=3, max_tokens=12) == first
    assert synthesize(model, tokenizer, 12, seed=4, max_tokens=12) != first


def test_killed_synthesis_resumes_to_the_same_requests(target: Path, tmp_path: Path) -> None:
    """Requests are saved batch by batch: a run killed in its second batch resumes from the first
    batch's requests and ends with exactly the uninterrupted run's list."""
    from trtbuild.draft.requests import BATCH, synthesize

    model, tokenizer = _model_and_tokenizer(target)
    count = BATCH + 8  # at least two batches
    whole = synthesize(model, tokenizer, count, seed=5, max_tokens=8)
    progress = tmp_path / "progress.json"
    written = 0

    def kill_in_second_batch(n: int) -> None:
        nonlocal written
        written += n
        if written > BATCH + 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        synthesize(model, tokenizer, count, seed=5, max_tokens=8, advance=kill_in_second_batch,
                   progress_file=progress)
    saved = json.loads(progress.read_text())
    assert saved["next_batch"] >= 1 and 0 < len(saved["requests"]) <= written
    assert saved["requests"] == whole[: len(saved["requests"])]
    assert synthesize(model, tokenizer, count, seed=5, max_tokens=8, progress_file=progress) == whole


def test_a_model_that_always_ends_the_turn_at_once_gives_no_request(target: Path) -> None:
    """Empty requests are dropped, and synthesis stops after 4x the asked count of samples."""
    from trtbuild.draft.requests import synthesize

    model, tokenizer = _model_and_tokenizer(target)
    def end_turn(module: object, inputs: object, logits: torch.Tensor) -> torch.Tensor:
        forced = torch.zeros_like(logits)
        forced[..., tokenizer.eos_token_id] = 100.0
        return forced

    model.lm_head.register_forward_hook(end_turn)
    assert synthesize(model, tokenizer, 3, seed=0, max_tokens=8) == []


def test_the_pool_answers_the_synthetic_requests_and_a_resumed_run_keeps_them(target: Path,
                                                                              isolated_cache: Path) -> None:
    from trtbuild.core.data.chat import chat_prompt_ids
    from trtbuild.core.data.sources import fingerprint
    from trtbuild.core.layout import DRAFT_DATA
    from trtbuild.draft.config import DraftConfig
    from trtbuild.draft.draft_data import REQUESTS_FILE, data_key, ensure_data, load_pool

    _, tokenizer = _model_and_tokenizer(target)
    config = DraftConfig(samples=6, seq_len=48, distill_fraction=1.0, synthetic_requests=6,
                         synthetic_request_tokens=8, shard_samples=3)
    key = data_key(config, "target-key", fingerprint(config.dataset, base_dir=None))
    assert key != data_key(config.model_copy(update={"synthetic_requests": 5}), "target-key",
                           fingerprint(config.dataset, base_dir=None))
    # a killed run left its requests behind: the resumed run answers those, not new ones
    planted = [f"question number {i}" for i in range(6)]
    work = shards.resume_dir(DRAFT_DATA, key)
    work.mkdir(parents=True)
    (work / REQUESTS_FILE).write_text(json.dumps(planted))
    made = ensure_data(config, target, "target-key", None, Progress())
    assert shards.read_meta(made.path)["synthetic_requests"] == 6
    rows = load_pool(made.path).tolist()
    requests = [chat_prompt_ids(tokenizer, [{"role": "user", "content": text}]) for text in planted]
    starts = sorted(next(r for r in requests if row[: len(r)] == r) for row in rows)
    assert starts == sorted(requests)  # every request answered once
    assert not work.exists()


def test_synthetic_requests_need_a_distilled_share() -> None:
    from trtbuild.draft.config import DraftConfig

    with pytest.raises(ValidationError, match="distill_fraction"):
        DraftConfig(synthetic_requests=10, distill_fraction=0.0)


def test_requests_of_many_lengths_answered_in_one_batch_get_their_own_greedy_answers(target: Path) -> None:
    """greedy_fill left-pads one batch; each row must be what the target answers that prompt alone
    (transformers' own greedy `generate`, one prompt at a time). Exact tokens hold on another CPU's
    rounding: along these paths the smallest top-1 / top-2 logit gap is 2.5e-4 (median 0.03), some
    hundred times the float32 difference between a batched and a single forward of this model."""
    from trtbuild.draft.data import greedy_fill

    model, _ = _model_and_tokenizer(target)
    with torch.no_grad():  # sharp attention and large outputs: positions and padding decide the tokens
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(30)
            layer.self_attn.k_proj.weight.mul_(30)
            layer.self_attn.o_proj.weight.mul_(10)
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 384, (n,), generator=generator).tolist() for n in (3, 11, 7, 11, 20)]
    filled = greedy_fill(model, prompts, 32)
    assert filled.shape == (5, 32)
    for row, prompt in zip(filled, prompts, strict=True):
        alone = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32 - len(prompt),
                               min_new_tokens=32 - len(prompt), pad_token_id=0)[0]
        assert row.tolist() == alone.tolist()
