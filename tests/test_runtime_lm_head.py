"""A float64 model's LM head (trtbuild.runtime.lm_head.RefinedHead): float32 GEMM, float64 values
wherever a logit can be its row's argmax, so greedy choices are the float64 ones at any row count."""

from __future__ import annotations

import torch

from trtbuild.runtime.lm_head import RefinedHead


def near_ties(vocab: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A head whose rows 0-3 give logits that differ by ~1e-9 relative (float32 cannot tell them
    apart) and inputs that make them the largest."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, hidden, generator=g, dtype=torch.float64) * 0.05
    weight[:4] = weight[0] * 3.0
    weight[1:4] += torch.randn(3, hidden, generator=g, dtype=torch.float64) * 1e-10
    x = weight[0].repeat(9, 1) * 40 + torch.randn(9, hidden, generator=g, dtype=torch.float64) * 1e-3
    return weight, x


def test_argmax_is_the_float64_argmax_on_near_ties() -> None:
    for seed in range(5):
        weight, x = near_ties(3000, 96, seed)
        exact = x @ weight.t()
        head = RefinedHead(weight)
        got = head(x)
        assert torch.equal(got.argmax(-1), exact.argmax(-1)), seed
        top = exact.argmax(-1, keepdim=True)
        assert torch.allclose(got.gather(-1, top), exact.gather(-1, top), rtol=1e-14, atol=0)
        # every other logit is within the float32 bound the head assumes
        bound = x.norm(dim=-1, keepdim=True) * head.error_per_norm
        assert ((got - exact).abs() <= bound).all()


def test_rows_alone_and_in_a_batch_pick_the_same_tokens_with_the_same_values() -> None:
    weight, x = near_ties(5000, 128, 7)
    head = RefinedHead(weight)
    batch = head(x)
    for i in range(x.shape[0]):
        alone = head(x[i: i + 1])[0]
        top = int(alone.argmax())
        assert int(batch[i].argmax()) == top
        assert batch[i, top] == alone[top]  # float64 values, the same dot product either way


def test_without_refinement_float32_gets_near_ties_wrong() -> None:
    """The case above is one float32 alone gets wrong: the refinement is what decides it."""
    wrong = 0
    for seed in range(5):
        weight, x = near_ties(3000, 96, seed)
        float32 = x.float() @ weight.float().t()
        wrong += int((float32.argmax(-1) != (x @ weight.t()).argmax(-1)).sum())
    assert wrong > 0
