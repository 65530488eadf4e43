"""Speculative decoding is lossless: greedy output equals plain greedy, sampling keeps the target's
distribution; for chain and tree drafting, with random drafts and a trained one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runtime_fixtures import eagle_module_model, export_draft, one_thread  # noqa: F401

from trtbuild.runtime import Generator, SamplingParams, SpecParams, load_draft, load_target
from trtbuild.runtime.devmodels import random_llama, train_byte_llama, train_eagle3_draft

SHAPES = [
    SpecParams(max_draft_len=1, mode="chain"),
    SpecParams(max_draft_len=4, mode="chain"),
    SpecParams(max_draft_len=3, mode="tree", topk=2, max_total_draft_tokens=6),
    SpecParams(max_draft_len=5, mode="tree", topk=4, max_total_draft_tokens=24),
    SpecParams(max_draft_len=2, mode="tree", topk=3, max_total_draft_tokens=50),  # budget > tree
]

pytestmark = pytest.mark.usefixtures("one_thread")


def build_pair(root: Path, vocab: int, draft_vocab: int, **target_kw) -> Generator:
    random_llama(root / "target", vocab=vocab, **target_kw)
    export_draft(eagle_module_model(root / "target", draft_vocab=draft_vocab), root / "eagle3")
    target = load_target(root / "target")
    return Generator(target, load_draft(root / "eagle3", target))


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("spec256"), 256, 128, layers=4)


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    """Vocabulary 8: a random draft's top-k often holds the target's token, so steps accept
    partially, through later branches of the tree, and K/V rows get moved."""
    return build_pair(tmp_path_factory.mktemp("spec8"), 8, 6, layers=2, hidden=32, intermediate=64,
                      heads=2, kv_heads=1)


def check_exact(generator: Generator, prompts: list[list[int]], new_tokens: int) -> list:
    stats = []
    for prompt in prompts:
        plain = generator.generate(prompt, new_tokens, eos_token_ids=[]).tokens
        for spec in SHAPES:
            run = generator.generate(prompt, new_tokens, spec=spec, eos_token_ids=[])
            assert run.tokens == plain, spec
            assert run.stats.new_tokens == new_tokens
            assert run.stats.target_forwards == 1 + len(run.stats.accepted)
            stats.append((spec, run.stats))
    return stats


def test_random_draft_is_exact(random_pair):
    stats = check_exact(random_pair, [[5, 17, 99, 3], list(range(40, 70))], 40)
    assert max(s.acceptance_length for _, s in stats) < 1.5  # a random draft barely ever hits


def test_partial_acceptance_through_tree_branches_is_exact(small_vocab_pair):
    prompts = [[1, 2, 3], [7, 7, 0, 5, 4], [3, 6, 1, 0, 2, 2, 5]]
    stats = check_exact(small_vocab_pair, prompts, 48)
    trees = [s for spec, s in stats if spec.mode == "tree"]
    assert sum(s.off_chain for s in trees) > 0  # accepted paths left the first branch
    assert any(0 < a < s.max_draft_len for s in trees for a in s.accepted)  # partial acceptance
    assert any(s.acceptance_length > 1.3 for s in trees)


def test_streaming_chunks_are_the_accepted_runs(small_vocab_pair):
    spec = SpecParams(max_draft_len=3, mode="tree", topk=3, max_total_draft_tokens=10)
    run = small_vocab_pair.stream([1, 2, 3], 30, spec=spec, eos_token_ids=[])
    chunks = list(run)
    assert [len(c) for c in chunks[1:-1]] == [a + 1 for a in run.stats.accepted[:len(chunks) - 2]]
    full = small_vocab_pair.generate([1, 2, 3], 30, eos_token_ids=[]).tokens
    assert [t for c in chunks for t in c] == full
    eos = full[12]
    stopped = small_vocab_pair.generate([1, 2, 3], 30, spec=spec, eos_token_ids=[eos]).tokens
    assert stopped == full[: full.index(eos) + 1]


def test_sampling_keeps_the_target_distribution(small_vocab_pair):
    """Distribution of the 2nd sampled token (decided by the first speculative step) against the
    exact marginal sum_x1 p(x1) p(x2 | x1) computed from the target's logits."""
    generator = small_vocab_pair
    target = generator.target
    prompt = [1, 2, 3]
    temperature = 1.0
    with torch.inference_mode():
        p1 = (target.logits(torch.tensor([prompt]))[0, -1] / temperature).softmax(-1)
        seconds = torch.tensor([prompt + [x] for x in range(8)])
        p2 = (target.logits(seconds)[:, -1] / temperature).softmax(-1)
    exact = (p1[:, None] * p2).sum(0)
    spec = SpecParams(max_draft_len=3, mode="tree", topk=2, max_total_draft_tokens=6)
    draws = 1000
    seen = torch.zeros(8)
    for seed in range(draws):
        tokens = generator.generate(prompt, 2, spec=spec, eos_token_ids=[],
                                    sampling=SamplingParams(temperature, seed=seed)).tokens
        seen[tokens[1]] += 1
    seen /= draws
    assert 0.5 * (seen - exact).abs().sum() < 0.1  # sampling noise ~0.035 with 1000 draws
    assert exact.max() < 0.9  # a real distribution, not a near-deterministic one


@pytest.mark.slow
def test_trained_draft_is_exact_and_accepts(tmp_path):
    """A byte-level target trained on pydoc and an EAGLE-3 draft trained on it with ModelOpt."""
    from trtbuild.runtime.devmodels import corpus_bytes

    train_byte_llama(tmp_path / "target", steps=120)
    train_eagle3_draft(tmp_path / "target", tmp_path / "eagle3", steps=80, draft_vocab=128)
    target = load_target(tmp_path / "target")
    generator = Generator(target, load_draft(tmp_path / "eagle3", target, first_norm="modelopt"))
    text = corpus_bytes("heldout")
    prompts = [text[i * 997:i * 997 + 40].tolist() for i in range(3)]
    stats = check_exact(generator, prompts, 48)
    taus = [s.acceptance_length for spec, s in stats if spec.max_draft_len >= 3]
    assert min(taus) > 2.0
