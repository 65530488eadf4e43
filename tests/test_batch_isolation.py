"""Issue 24 finding 1: one request cannot fail the batch. A sequence whose step fails (its sampler
meets NaN from a temperature that overflows the logits, its logits are not finite) fails alone with
its own error, a prompt id outside the target's vocabulary (a mismatched tokenizer) is refused for
that request alone, and the other sequences' tokens equal their solo greedy decoding."""

from __future__ import annotations

import pytest
import torch
from draft_fixtures import write_target
from runtime_fixtures import one_thread  # noqa: F401
from test_runtime_speculative import build_pair

from trtbuild.core.errors import UserError
from trtbuild.runtime import Generator, SamplingParams
from trtbuild.runtime.batch import BatchDecoder
from trtbuild.runtime.batch_eagle3 import Eagle3ChainSpeculator
from trtbuild.runtime.sampling import TEMPERATURE_EPSILON

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2, 3], [7, 7, 0, 5, 4], [3, 6, 1, 0, 2, 2, 5], [4, 1]]
NEW = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Generator:
    return build_pair(tmp_path_factory.mktemp("iso"), 8, 6, layers=2, hidden=32, intermediate=64, heads=2,
                      kv_heads=1)


def _hostile_sampling() -> SamplingParams:
    """What 1e-40 did before the epsilon, handed on by a validator with a gap: a temperature whose
    division makes the softmax NaN, which torch.multinomial refuses. (Now 1e-40 decodes greedily and
    NaN is refused, so the range check is stepped past: this tests the second line of defence.)"""
    params = SamplingParams(temperature=1.0, seed=3)
    object.__setattr__(params, "temperature", float("nan"))
    return params


@pytest.mark.parametrize("hostile_joins_at", [0, 3])  # with the others' prefill, or while they decode
@pytest.mark.parametrize("speculative", [False, True])
def test_four_greedy_sequences_are_unaffected_by_a_hostile_one(pair: Generator, hostile_joins_at: int,
                                                               speculative: bool) -> None:
    solo = [pair.generate(p, NEW, eos_token_ids=[]).tokens for p in PROMPTS]
    speculator = Eagle3ChainSpeculator(pair.draft, 3, 8) if speculative else None
    decoder = BatchDecoder(pair.target, 8)
    seqs = [decoder.add(p, NEW, eos_token_ids=[], speculator=speculator, draft_slack=3 if speculative else 0)
            for p in PROMPTS]
    got: dict[int, list[int]] = {s.id: [] for s in seqs}
    errors: dict[int, str] = {}
    hostile = None
    step = 0
    while not decoder.idle or hostile is None:
        if step == hostile_joins_at:
            hostile = decoder.add([5, 4, 3], NEW, sampling=_hostile_sampling(), eos_token_ids=[],
                                  speculator=speculator, draft_slack=3 if speculative else 0)
            got[hostile.id] = []
        for event in decoder.step():
            got[event.seq.id] += event.tokens
            if event.error is not None:
                assert event.finished
                errors[event.seq.id] = event.error
        step += 1
    assert hostile is not None and set(errors) == {hostile.id}
    assert "sampling failed" in errors[hostile.id] and hostile.error == errors[hostile.id]
    assert [got[s.id] for s in seqs] == solo
    assert all(s.error is None and s.done for s in seqs) and decoder.running == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_sequence_with_non_finite_logits_fails_alone(pair: Generator, bad: float) -> None:
    """NaN logits from the model itself (an overflow in one sequence's rows): that sequence fails,
    greedy or not, and the others decode on. The model's output is corrupted for one row exactly
    as an overflow would, by wrapping the real forward."""
    from trtbuild.runtime import batch as batch_module

    solo = [pair.generate(p, NEW, eos_token_ids=[]).tokens for p in PROMPTS]
    decoder = BatchDecoder(pair.target, 8)
    seqs = [decoder.add(p, NEW, eos_token_ids=[]) for p in PROMPTS]
    victim = decoder.add([6, 6, 6], NEW, eos_token_ids=[])
    real = batch_module.target_groups
    calls = [0]

    def overflowing(target, groups, aux_layers=()):  # noqa: ANN001, ANN202
        results = real(target, groups, aux_layers=aux_layers)
        calls[0] += 1
        if calls[0] == 4:  # the victim's row of the fourth step's logits overflows
            slot = decoder.running.index(victim)
            results[0][0][slot, 0, 5] = bad  # one logit of its row is enough
        return results

    batch_module.target_groups = overflowing
    try:
        got: dict[int, list[int]] = {s.id: [] for s in [*seqs, victim]}
        failed = []
        while not decoder.idle:
            for event in decoder.step():
                got[event.seq.id] += event.tokens
                if event.error:
                    failed.append((event.seq.id, event.error))
    finally:
        batch_module.target_groups = real
    assert failed == [(victim.id, "the model's logits for this request are not finite (NaN or inf)")]
    assert [got[s.id] for s in seqs] == solo


def test_a_prompt_id_outside_the_vocabulary_is_refused_for_that_request_alone(pair: Generator) -> None:
    decoder = BatchDecoder(pair.target, 8)
    first = decoder.add(PROMPTS[0], NEW, eos_token_ids=[])
    decoder.step()
    for bad in ([1, 8, 2], [-1], [2**40]):
        with pytest.raises(UserError, match=r"outside the model's vocabulary \[0, 8\)"):
            decoder.add(bad, NEW, eos_token_ids=[])
    while not decoder.idle:
        decoder.step()
    assert first.emitted == pair.generate(PROMPTS[0], NEW, eos_token_ids=[]).tokens


def test_a_temperature_below_epsilon_is_greedy(pair: Generator) -> None:
    for temperature in (1e-40, 1e-45, 1e-38, TEMPERATURE_EPSILON / 2):
        params = SamplingParams(temperature=temperature, seed=1)
        assert params.greedy
        assert pair.generate(PROMPTS[1], NEW, sampling=params, eos_token_ids=[]).tokens == \
            pair.generate(PROMPTS[1], NEW, eos_token_ids=[]).tokens
    assert not SamplingParams(temperature=TEMPERATURE_EPSILON).greedy


@pytest.mark.parametrize("values,field", [
    ({"temperature": float("nan")}, "temperature"), ({"temperature": float("inf")}, "temperature"),
    ({"temperature": -1e-9}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_k": 2**32 + 1}, "top_k"), ({"top_k": -1}, "top_k"), ({"top_k": True}, "top_k"), ({"top_k": 1.5}, "top_k"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": float("nan")}, "top_p"),
    ({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"), ({"seed": 10**5000}, "seed"),
], ids=lambda v: "huge" if isinstance(v, dict) and v.get("seed") == 10**5000 else str(v))
def test_sampling_parameters_are_range_checked(values: dict, field: str) -> None:
    with pytest.raises(UserError) as info:
        SamplingParams(**values)
    assert info.value.field == field and len(info.value.one_line()) < 200


@pytest.fixture(scope="module")
def text_models(tmp_path_factory):
    """A real BPE tokenizer of 384 ids with a matching target, and one whose vocabulary is 200
    (a tokenizer that does not match the model: what `validate` now refuses for a recipe)."""
    from trtbuild.serve.textgen import TextGenerator

    root = tmp_path_factory.mktemp("text")
    matching = TextGenerator(write_target(root / "ok", num_hidden_layers=2))
    mismatched = TextGenerator(write_target(root / "small", num_hidden_layers=2, vocab_size=200))
    return matching, mismatched


TEXTS = ["def parse(text):", "import os\nimport sys", "class Queue:", "return self.items"]


def _drain(batcher, requests: dict) -> dict:
    from trtbuild.serve.textbatch import TextBatcher

    assert isinstance(batcher, TextBatcher)
    out: dict = {}
    refused: dict = {}
    for tag, request in requests.items():
        try:
            batcher.submit(request, tag)
        except UserError as exc:
            refused[tag] = exc.one_line()
    while not batcher.idle:
        for event in batcher.step():
            if event.error is not None:
                out[event.tag] = ("error", event.error)
            elif event.finished:
                out[event.tag] = (event.result_text, event.result_ids)
    return {**out, **{tag: ("refused", why) for tag, why in refused.items()}}


def test_text_batch_four_greedy_requests_and_a_hostile_temperature(text_models) -> None:
    from trtbuild.serve.textbatch import TextBatcher
    from trtbuild.serve.textgen import GenRequest

    generator, _ = text_models
    solo = {i: generator.generate(GenRequest(prompt=t, max_tokens=16)) for i, t in enumerate(TEXTS)}
    requests = {i: GenRequest(prompt=t, max_tokens=16) for i, t in enumerate(TEXTS)}
    requests["hostile"] = GenRequest(prompt="def f(x):", max_tokens=16, temperature=1e-40, seed=7)
    got = _drain(TextBatcher(generator, 8), requests)
    assert {i: got[i] for i in solo} == {i: (r.text, r.ids) for i, r in solo.items()}
    # below the epsilon a temperature decodes greedily: the hostile request is answered, not failed
    assert got["hostile"] == (lambda r: (r.text, r.ids))(generator.generate(GenRequest(prompt="def f(x):",
                                                                                       max_tokens=16)))


def test_text_batch_with_a_tokenizer_beyond_the_model_vocabulary(text_models) -> None:
    from trtbuild.serve.textbatch import TextBatcher
    from trtbuild.serve.textgen import GenRequest

    _, mismatched = text_models
    low = [t for t in ("abc", "ABC", "x.y()", "abcabc") if max(mismatched.encode(t)) < 200]
    high = "def parse(text): return self.items"
    assert len(low) == 4 and max(mismatched.encode(high)) >= 200
    solo = {i: mismatched.generate(GenRequest(prompt=t, max_tokens=12)) for i, t in enumerate(low)}
    requests = {i: GenRequest(prompt=t, max_tokens=12) for i, t in enumerate(low)}
    requests["hostile"] = GenRequest(prompt=high, max_tokens=12)
    got = _drain(TextBatcher(mismatched, 8), requests)
    assert got["hostile"][0] == "refused" and "outside the model's vocabulary [0, 200)" in got["hostile"][1]
    assert {i: got[i] for i in solo} == {i: (r.text, r.ids) for i, r in solo.items()}


def test_logits_division_really_overflows_at_such_temperatures() -> None:
    """The premise of the epsilon: logits of ordinary size divided by 1e-40 are not finite."""
    logits = torch.tensor([3.0, 1.0, -2.0])
    assert not torch.isfinite((logits / 1e-40).softmax(-1)).all()
    assert torch.isfinite((logits / TEMPERATURE_EPSILON).softmax(-1)).all()
