"""The draft data's attention (trtbuild.draft.gqa_attention): transformers' SDPA without repeating grouped
K/V under a padding mask gives the same logits and the same greedy rows as transformers' own `sdpa`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from draft_fixtures import write_target

from trtbuild.draft.data import greedy_fill, load_target
from trtbuild.draft.gqa_attention import NAME


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("gqa") / "hf", num_attention_heads=6, num_key_value_heads=2,
                        head_dim=16, hidden_size=96)


def test_left_padded_generation_is_the_same_as_transformers_sdpa(target: Path) -> None:
    ours, theirs = load_target(target), load_target(target, attention="sdpa")
    assert ours.config._attn_implementation == NAME and theirs.config._attn_implementation == "sdpa"
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 12, 23)]
    assert torch.equal(greedy_fill(ours, prompts, 48), greedy_fill(theirs, prompts, 48))

    width = max(len(p) for p in prompts)  # one padded prefill, compared as logits
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        b = theirs(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert torch.allclose(a[real], b[real], atol=1e-5, rtol=1e-5)


def test_unpadded_and_ungrouped_models_take_transformers_own_path(target: Path, tmp_path: Path) -> None:
    """Without a mask (training rows, the hidden-state dump) or without grouping, nothing changes: the call
    goes to transformers' function, bit for bit."""
    ids = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(load_target(target)(input_ids=ids).logits,
                           load_target(target, attention="sdpa")(input_ids=ids).logits)
    plain = write_target(tmp_path / "mha", num_attention_heads=4, num_key_value_heads=4)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        assert torch.equal(load_target(plain)(input_ids=ids, attention_mask=mask).logits,
                           load_target(plain, attention="sdpa")(input_ids=ids, attention_mask=mask).logits)
