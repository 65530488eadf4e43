"""In-flight batching: every sequence of a batch decodes exactly as it would alone.

Sequences of different lengths join at different steps, some with EAGLE-3 chain drafting and
some without, finish at their own EOS / budget, get cancelled; each one's tokens are compared
with single-stream `Generator.generate` of the same prompt, which the speculative tests already
tie to plain greedy decoding.
"""

from __future__ import annotations

import copy

import pytest
import torch
from runtime_fixtures import eagle_module_model, export_draft, one_thread  # noqa: F401
from test_runtime_fp8 import quantize_and_export
from test_runtime_speculative import build_pair

from trtbuild.runtime import Generator, SamplingParams, load_draft, load_target
from trtbuild.runtime.batch import BatchDecoder
from trtbuild.runtime.batch_eagle3 import Eagle3ChainSpeculator
from trtbuild.runtime.batch_forward import Layout, target_rows
from trtbuild.runtime.devmodels import random_llama

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2, 3], [7, 7, 0, 5, 4], [3, 6, 1, 0, 2, 2, 5], [4], [5, 5, 5, 5, 1, 2, 3, 4, 0], [2, 2],
           [6, 1, 6], [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory) -> Generator:
    """Vocabulary 8: a random draft is often right, so acceptance is partial and varied."""
    return build_pair(tmp_path_factory.mktemp("batch8"), 8, 6, layers=2, hidden=32, intermediate=64, heads=2,
                kv_heads=1)


@pytest.fixture(scope="module")
def fp8(tmp_path_factory) -> Generator:
    """A ModelOpt FP8 target (float64 compute on CPU) with a random EAGLE-3 draft, vocabulary 256."""
    root = tmp_path_factory.mktemp("batchfp8")
    base = random_llama(root / "fp32", layers=2, init_range=0.05, max_positions=256)
    _, export = quantize_and_export(copy.deepcopy(base), root / "target", kv_cache=True)
    export()
    export_draft(eagle_module_model(root / "fp32", draft_vocab=128), root / "eagle3")
    target = load_target(root / "target")
    assert target.is_fp8 and target.dtype == torch.float64
    return Generator(target, load_draft(root / "eagle3", target))


def run(decoder: BatchDecoder, pending: dict[int, list]) -> dict[int, list[int]]:
    """Adds pending[k] (lists of add() kwargs) after k steps; drains; tokens per sequence id."""
    out: dict[int, list[int]] = {}
    seqs = []
    step = 0
    while pending or not decoder.idle:
        for kwargs in pending.pop(step, []):
            seqs.append(decoder.add(**kwargs))
            out[seqs[-1].id] = []
        for event in decoder.step():
            out[event.seq.id] += event.tokens
        step += 1
    return {seq.id: out[seq.id] for seq in seqs}


@pytest.mark.parametrize("max_batch, prefill_tokens, speculate_up_to", [
    (8, 128, None),  # four prefilled at once, the others join while those decode
    (3, 128, None),  # more sequences than slots: they wait for one to finish
    (8, 4, 3),  # one admission per step; drafting pauses while more than 3 decode, then resumes
])
def test_eight_concurrent_prompts_equal_single_stream(small_vocab: Generator, max_batch: int, prefill_tokens: int,
                                                      speculate_up_to: int | None) -> None:
    gen = small_vocab
    speculator = Eagle3ChainSpeculator(gen.draft, 3, max_batch)
    new = 40
    jobs = [dict(prompt=p, max_new_tokens=new - 4 * (i % 3), eos_token_ids=[], draft_slack=3,
                 speculator=speculator if i % 3 else None) for i, p in enumerate(PROMPTS)]
    decoder = BatchDecoder(gen.target, max_batch, prefill_tokens=prefill_tokens, speculate_up_to=speculate_up_to)
    got = run(decoder, {0: jobs[:4], 2: jobs[4:6], 5: jobs[6:]})
    for i, ((seq_id, tokens), prompt) in enumerate(zip(got.items(), PROMPTS, strict=True)):
        assert tokens == gen.generate(prompt, new - 4 * (i % 3), eos_token_ids=[]).tokens, seq_id


def test_drafting_pauses_above_the_batch_limit_and_resumes(small_vocab: Generator) -> None:
    gen = small_vocab
    decoder = BatchDecoder(gen.target, 8, speculate_up_to=2)
    speculator = Eagle3ChainSpeculator(gen.draft, 3, 8)
    seqs = [decoder.add(p, 12 + 8 * i, eos_token_ids=[], speculator=speculator, draft_slack=3)
            for i, p in enumerate(PROMPTS[:4])]
    while not decoder.idle:
        decoder.step()
    last = seqs[-1].stats.accepted  # runs with 4, 3, then 2 and 1 sequences left
    assert set(last[:4]) == {0} and any(a > 0 for a in last[-10:])
    for seq, prompt in zip(seqs, PROMPTS, strict=False):
        assert seq.emitted == gen.generate(prompt, seq.max_new, eos_token_ids=[]).tokens


def test_draft_length_follows_the_schedule_by_batch_size(small_vocab: Generator) -> None:
    gen = small_vocab
    # TensorRT-LLM's meaning: keys are the upper ends of bands, nothing above the largest
    decoder = BatchDecoder(gen.target, 8, draft_len_schedule={2: 4, 4: 1})
    assert [decoder.draft_len(n) for n in (1, 2, 3, 4, 5, 8)] == [4, 4, 1, 1, 0, 0]
    assert BatchDecoder(gen.target, 8).draft_len(8) is None
    decoder = BatchDecoder(gen.target, 8, draft_len_schedule={2: 4, 8: 1})
    speculator = Eagle3ChainSpeculator(gen.draft, 4, 8)
    proposed: list[tuple[int, int]] = []  # (sequences decoding, longest proposal)
    propose = speculator.propose

    def recording(seqs, limit=None):  # noqa: ANN001, ANN202
        out = propose(seqs, limit)
        proposed.append((len(decoder.running), max(len(p) for p in out)))
        return out

    speculator.propose = recording  # type: ignore[method-assign]
    seqs = [decoder.add(p, 10 + 10 * i, eos_token_ids=[], speculator=speculator, draft_slack=4)
            for i, p in enumerate(PROMPTS[:4])]
    while not decoder.idle:
        decoder.step()
    assert {n for running, n in proposed if running >= 3} == {1}
    assert {n for running, n in proposed if running < 3} == {4}
    for seq, prompt in zip(seqs, PROMPTS, strict=False):
        assert seq.emitted == gen.generate(prompt, seq.max_new, eos_token_ids=[]).tokens


def test_a_new_sequence_joins_the_running_ones_step(small_vocab: Generator) -> None:
    """A prompt that arrives while others decode is prefilled in their next step's forward: that
    step gives the running sequence its tokens and the new one its first token."""
    gen = small_vocab
    decoder = BatchDecoder(gen.target, 8)
    first = decoder.add(PROMPTS[0], 20, eos_token_ids=[])
    decoder.step()
    second = decoder.add(PROMPTS[1], 20, eos_token_ids=[])
    events = decoder.step()
    assert {e.seq.id for e in events if e.tokens} == {first.id, second.id}
    assert first.stats.target_forwards == 2 and second.stats.target_forwards == 1
    while not decoder.idle:
        decoder.step()
    for seq, prompt in ((first, PROMPTS[0]), (second, PROMPTS[1])):
        assert seq.emitted == gen.generate(prompt, 20, eos_token_ids=[]).tokens


def test_a_prompt_longer_than_the_cache_joins_a_running_step(small_vocab: Generator) -> None:
    """The joining prompt grows the KV cache in the middle of a step; the running sequence's rows
    of that same forward must land in the grown cache too."""
    gen = small_vocab
    decoder = BatchDecoder(gen.target, 4)
    capacity = decoder.kv.capacity
    long_prompt = [(3 * i + 1) % 8 for i in range(capacity + 9)]
    first = decoder.add(PROMPTS[2], 24, eos_token_ids=[])
    decoder.step()
    second = decoder.add(long_prompt, 12, eos_token_ids=[])
    before = first.length
    decoder.step()
    assert decoder.kv.capacity > capacity and second.stats.target_forwards == 1
    written = decoder.kv.data[:, :, 0, :, before: first.length]  # the running sequence's rows of that step
    assert first.length == before + 1 and bool(written.abs().amax(-1).gt(0).all())
    while not decoder.idle:
        decoder.step()
    assert first.emitted == gen.generate(PROMPTS[2], 24, eos_token_ids=[]).tokens
    assert second.emitted == gen.generate(long_prompt, 12, eos_token_ids=[]).tokens


def test_speculative_steps_accept_partially_and_record_it(small_vocab: Generator) -> None:
    gen = small_vocab
    decoder = BatchDecoder(gen.target, 8)
    speculator = Eagle3ChainSpeculator(gen.draft, 4, 8)
    seqs = [decoder.add(p, 48, eos_token_ids=[], speculator=speculator, draft_slack=4) for p in PROMPTS]
    while not decoder.idle:
        decoder.step()
    accepted = [a for seq in seqs for a in seq.stats.accepted]
    assert any(0 < a < 4 for a in accepted) and any(a == 0 for a in accepted)
    for seq, prompt in zip(seqs, PROMPTS, strict=True):
        assert seq.emitted == gen.generate(prompt, 48, eos_token_ids=[]).tokens
        assert seq.stats.target_forwards == 1 + len(seq.stats.accepted)
        assert sum(a + 1 for a in seq.stats.accepted) + 1 >= seq.stats.new_tokens


def test_eos_budgets_and_cancellation_leave_the_others_exact(small_vocab: Generator) -> None:
    gen = small_vocab
    full = [gen.generate(p, 40, eos_token_ids=[]).tokens for p in PROMPTS]
    decoder = BatchDecoder(gen.target, 8)
    speculator = Eagle3ChainSpeculator(gen.draft, 3, 8)
    eos = [[full[i][10 + i]] if i % 2 else [] for i in range(8)]  # odd ones stop at their own EOS
    budgets = [40, 40, 7, 40, 1, 40, 23, 40]
    seqs = [decoder.add(p, budgets[i], eos_token_ids=eos[i], speculator=speculator if i < 5 else None,
                        draft_slack=3) for i, p in enumerate(PROMPTS)]
    cancelled = seqs[7]
    finished = []
    for step in range(200):
        if step == 6:
            decoder.cancel(cancelled)
        for event in decoder.step():
            if event.finished:
                finished.append(event.seq.id)
        if decoder.idle:
            break
    assert sorted(finished) == list(range(8)) and len(decoder.running) == 0
    assert 0 < len(cancelled.emitted) < 40 and cancelled.emitted == full[7][: len(cancelled.emitted)]
    for i, seq in enumerate(seqs[:7]):
        alone = gen.generate(PROMPTS[i], budgets[i], eos_token_ids=eos[i]).tokens
        assert seq.emitted == alone, i
    assert len(speculator.order) == 0  # every sequence released its draft slot


def test_seeded_sampling_matches_single_stream(small_vocab: Generator) -> None:
    gen = small_vocab
    decoder = BatchDecoder(gen.target, 4)
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(len(PROMPTS))]
    seqs = [decoder.add(p, 30, sampling=params[i], eos_token_ids=[]) for i, p in enumerate(PROMPTS)]
    while not decoder.idle:
        decoder.step()
    alone = [gen.generate(p, 30, sampling=params[i], eos_token_ids=[]).tokens for i, p in enumerate(PROMPTS)]
    assert [s.emitted for s in seqs] == alone
    assert len({tuple(t) for t in alone}) > 1  # really sampled


def test_padded_rows_compute_what_each_sequence_computes_alone(fp8: Generator) -> None:
    """One batched forward over sequences at different positions (padding, masks) gives each
    row the logits of that sequence's own single-stream forward."""
    target = fp8.target
    prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 17, 9)]
    alone = []
    for prompt in prompts:
        cache = target.new_cache(1, 64)
        with torch.inference_mode():
            target.forward(prompt[:-3].view(1, -1), cache, 0)
            alone.append(target.forward(prompt[-3:].view(1, -1), cache, prompt.numel() - 3)[0][0])
    from trtbuild.runtime.batch_kv import BatchKV

    s = target.spec
    kv = BatchKV(s.num_layers, 3, s.num_kv_heads, s.head_dim, target.dtype)
    width = max(p.numel() for p in prompts) - 3
    ids = torch.zeros(3, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : p.numel() - 3] = p[:-3]
    kv.ensure(64)
    with torch.inference_mode():
        target_rows(target, ids, kv.view(0, 3), Layout.causal(torch.zeros(3, dtype=torch.long), width, 256))
        starts = torch.tensor([p.numel() - 3 for p in prompts])
        batched, _ = target_rows(target, torch.stack([p[-3:] for p in prompts]), kv.view(0, 3),
                                 Layout.causal(starts, 3, 256))
    for i in range(3):
        # the hidden states agree to float64 rounding; the head (lm_head.RefinedHead) is float32
        # except at the logits that can be a row's argmax, which are float64 and agree as tightly
        top = alone[i].argmax(-1, keepdim=True)
        assert torch.equal(batched[i].argmax(-1, keepdim=True), top)
        assert torch.allclose(batched[i].gather(-1, top), alone[i].gather(-1, top), rtol=0, atol=1e-12)
        assert torch.allclose(batched[i], alone[i], rtol=0, atol=1e-5 * float(alone[i].abs().max()))


def test_fp8_target_batched_equals_single_stream(fp8: Generator) -> None:
    gen = fp8
    prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(10 + n)).tolist()
               for n in (3, 8, 12, 20, 5, 30, 1, 16)]
    speculator = Eagle3ChainSpeculator(gen.draft, 3, 8)
    jobs = [dict(prompt=p, max_new_tokens=48, eos_token_ids=[], draft_slack=3,
                 speculator=speculator if i % 2 else None) for i, p in enumerate(prompts)]
    got = run(BatchDecoder(gen.target, 8), {0: jobs[:5], 3: jobs[5:]})
    for tokens, prompt in zip(got.values(), prompts, strict=True):
        assert tokens == gen.generate(prompt, 48, eos_token_ids=[]).tokens
