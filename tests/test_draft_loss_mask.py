"""The answer-only loss mask (bench/draft_loss_mask.py; not the stage's default, see bench/RESULTS.md):
on a chat row, the target's answer after the request through its first EOS; not the request, not
what the target writes past its EOS. ModelOpt's EAGLE-3 loss honours it as the mask says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from draft_fixtures import write_target

from trtbuild.draft.data import answer_loss_mask

EOS = 2


def test_chat_rows_train_on_their_answer_only() -> None:
    rows = torch.tensor([
        [1, 5, 6, 40, 41, 42, EOS, 1, 9, 9, 9, 9],  # answer at 3..5, EOS at 6, then an invented turn
        [1, 5, 6, 8, 9, 50, 51, 52, 53, 54, 55, 56],  # an answer cut by seq_len: no EOS
    ])
    mask = answer_loss_mask(rows, [3, 5], [EOS])
    # mask[m] weights the draft's prediction of token m + 1: answer tokens 4, 5 and the EOS at 6
    # (the first answer token, 3, is the target's own prefill output at serving)
    assert mask[0].tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert mask[1].tolist() == [0] * 5 + [1] * 6 + [0]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("target") / "hf")


def test_modelopt_loss_ignores_what_the_mask_leaves_out(target: Path) -> None:
    """ModelOpt's EAGLE-3 forward with our mask: tokens past the EOS do not change the loss, tokens of
    the answer do; without the mask the tokens past the EOS count too."""
    from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target

    torch.manual_seed(0)
    model = convert_to_eagle3(load_target(target), DraftArch(aux_layers=[0, 2], draft_vocab_size=384), None)
    model.train()
    row = torch.randint(20, 384, (1, 24), generator=torch.Generator().manual_seed(1))
    row[0, :6] = torch.tensor([1, 11, 12, 13, 14, 15])  # the request
    row[0, 14] = EOS
    past_eos, in_answer = row.clone(), row.clone()
    past_eos[0, 16:] = torch.randint(20, 384, (8,), generator=torch.Generator().manual_seed(2))
    in_answer[0, 9] = (int(row[0, 9]) + 1) % 384
    mask = answer_loss_mask(row, [6], [EOS])
    assert mask.sum() == 8  # predictions of tokens 7..14

    def loss(ids: torch.Tensor, masked: bool = True) -> float:
        torch.manual_seed(3)  # whatever ModelOpt draws in a training forward, the same draws each time
        with torch.no_grad():
            return float(model(input_ids=ids, loss_mask=mask if masked else None).loss)

    assert loss(past_eos) == pytest.approx(loss(row), rel=1e-6)
    assert loss(in_answer) != pytest.approx(loss(row), rel=1e-4)
    assert loss(past_eos, masked=False) != pytest.approx(loss(row, masked=False), rel=1e-4)
