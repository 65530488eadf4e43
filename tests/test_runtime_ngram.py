"""Prompt-lookup (n-gram) drafting: the proposal rule against a brute-force search, and n-gram
speculative decoding is lossless (greedy output equals plain greedy decoding)."""

from __future__ import annotations

import random

import pytest
from runtime_fixtures import one_thread  # noqa: F401

from trtbuild.runtime import Generator, SamplingParams, SpecParams, load_target
from trtbuild.runtime.devmodels import random_llama
from trtbuild.runtime.ngram import NGramDrafter

pytestmark = pytest.mark.usefixtures("one_thread")


def brute_force(ctx: list[int], max_ngram: int, k: int, oldest: bool) -> list[int]:
    """Longest suffix first; among its earlier occurrences that have a continuation, the first
    (oldest) or the last; propose what followed it."""
    for n in range(min(max_ngram, len(ctx)), 0, -1):
        suffix = ctx[len(ctx) - n:]
        starts = [i for i in range(len(ctx) - n) if ctx[i:i + n] == suffix]
        if starts:
            i = starts[0] if oldest else starts[-1]
            return ctx[i + n:i + n + k]
    return []


@pytest.mark.parametrize("oldest", [True, False])
@pytest.mark.parametrize("max_ngram", [1, 2, 3])
def test_proposals_match_a_brute_force_search(max_ngram: int, oldest: bool) -> None:
    rng = random.Random(max_ngram * 2 + oldest)
    for _ in range(20):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        drafter = NGramDrafter(max_ngram, 5, use_oldest=oldest)
        done = 0
        while done < len(tokens):  # fed in chunks, as decoding emits them
            step = rng.randrange(1, 5)
            drafter.extend(tokens[done:done + step])
            done += step
            ctx = tokens[:done]
            assert drafter.propose() == brute_force(ctx, max_ngram, 5, oldest)
            assert drafter.propose(2) == brute_force(ctx, max_ngram, 2, oldest)


def test_longest_match_wins_and_unknown_suffix_proposes_nothing() -> None:
    drafter = NGramDrafter(3, 4)
    drafter.extend([1, 2, 3, 9, 9, 2, 3, 7, 7, 1, 2, 3])
    assert drafter.propose() == [9, 9, 2, 3]  # "1 2 3" (3-gram) beats the newer "2 3" -> 7
    drafter.extend([5])
    assert drafter.propose() == []
    with pytest.raises(ValueError):
        NGramDrafter(0, 3)


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    root = tmp_path_factory.mktemp("ngram")
    random_llama(root / "target", vocab=16, layers=2, hidden=32, intermediate=64, heads=2, kv_heads=1)
    return Generator(load_target(root / "target"))  # no draft model: n-gram needs none


@pytest.mark.parametrize("depth,max_ngram", [(1, 1), (3, 2), (5, 3)])
def test_ngram_decoding_is_exact(generator, depth: int, max_ngram: int) -> None:
    spec = SpecParams(max_draft_len=depth, method="ngram", max_matching_ngram_size=max_ngram)
    accepted = 0
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [5, 4, 5, 4, 5, 4], list(range(16)) * 2):
        plain = generator.generate(prompt, 40, eos_token_ids=[]).tokens
        run = generator.generate(prompt, 40, spec=spec, eos_token_ids=[])
        assert run.tokens == plain
        assert run.stats.new_tokens == 40 and run.stats.target_forwards == 1 + len(run.stats.accepted)
        assert max(run.stats.accepted) <= depth
        accepted += sum(run.stats.accepted)
    assert accepted > 0  # a 16-token vocabulary repeats itself: some proposals were right


def test_ngram_sampling_and_eos(generator) -> None:
    spec = SpecParams(max_draft_len=3, method="ngram")
    full = generator.generate([1, 2, 3], 30, eos_token_ids=[]).tokens
    eos = full[10]
    assert generator.generate([1, 2, 3], 30, spec=spec, eos_token_ids=[eos]).tokens == full[:full.index(eos) + 1]
    sampled = generator.generate([1, 2, 3], 30, spec=spec, eos_token_ids=[],
                                 sampling=SamplingParams(temperature=1.0, seed=3))
    assert len(sampled.tokens) == 30 and all(0 <= t < 16 for t in sampled.tokens)
