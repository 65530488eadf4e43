"""draft.train_samples: a data-size curve from one pool (the pool and its hidden states are keyed by
`samples`; training reads the first train_samples rows)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtbuild.draft.config import DraftConfig
from trtbuild.draft.draft_data import data_key


def test_train_samples_leave_the_pool_key_alone_and_size_the_schedule() -> None:
    whole = DraftConfig(samples=1000, batch_size=10, epochs=2)
    part = DraftConfig(samples=1000, batch_size=10, epochs=2, train_samples=300)
    assert data_key(whole, "target", "data") == data_key(part, "target", "data")
    assert data_key(DraftConfig(samples=999), "target", "data") != data_key(whole, "target", "data")
    assert (whole.used_samples(), whole.total_steps()) == (1000, 200)
    assert (part.used_samples(), part.total_steps()) == (300, 60)
    assert DraftConfig(samples=100, train_samples=300).used_samples() == 100  # never more than the pool


def test_train_samples_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        DraftConfig(train_samples=0)
