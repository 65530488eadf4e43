"""When the draft's training shards the frozen target (FSDP2) and what it shards. The sharded training
itself runs in tests/test_draft_distributed.py (slow: two gloo ranks)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtbuild.draft.sharding import AUTO_SHARE_OF_GPU, frozen_names, resolve, target_layers

GIB = 1 << 30


def test_auto_shards_only_a_target_too_big_for_one_gpu_with_ranks_to_share_it() -> None:
    gpu = 80 * GIB
    big, small = int(AUTO_SHARE_OF_GPU * gpu) + 1, int(AUTO_SHARE_OF_GPU * gpu) - 1
    assert resolve("auto", "cuda", 8, big, gpu) == "fsdp"
    assert resolve("auto", "cuda", 8, small, gpu) == "none"
    assert resolve("auto", "cuda", 1, big, gpu) == "none"  # nobody to share with
    assert resolve("auto", "cpu", 8, big, None) == "none"
    assert resolve("fsdp", "cpu", 2, 1, None) == "fsdp" and resolve("none", "cuda", 8, big, gpu) == "none"


def test_fsdp_needs_several_processes_and_an_online_target() -> None:
    from trtbuild.draft.config import DraftConfig

    with pytest.raises(ValidationError, match="processes"):
        DraftConfig(train={"target_sharding": "fsdp"})
    with pytest.raises(ValidationError, match="offline"):
        DraftConfig(hidden_states="offline", train={"target_sharding": "fsdp", "processes": 2})
    DraftConfig(train={"target_sharding": "fsdp", "processes": 2})


def test_the_target_layers_are_sharded_and_only_the_draft_is_left_to_ddp(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from draft_fixtures import write_target

    from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target

    arch = DraftArch(aux_layers=[0, 2], draft_vocab_size=384)
    model = convert_to_eagle3(load_target(write_target(tmp_path / "hf")), arch, None)
    layers = target_layers(model)
    assert layers is model.model.layers and len(layers) == 4
    frozen = set(frozen_names(model))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not trainable & frozen
    assert all(n.startswith("eagle_module.") for n in trainable)
    assert {n for n, _ in model.named_parameters()} - trainable <= frozen


def test_plan_says_how_a_target_too_big_for_one_gpu_is_held() -> None:
    from trtbuild.app.gpu_plan import _target_fit
    from trtbuild.draft.config import DraftConfig

    maverick = 800e9  # BF16 bytes
    sharded = DraftConfig(batch_size=64, train={"processes": 8, "nodes": 4})
    [line] = _target_fit(sharded, sharded.train, 32, maverick)
    assert "FSDP2 over 32 ranks: ~25 GB of 800 GB per rank (fits" in line
    [line] = _target_fit(sharded, sharded.train, 8, maverick)
    assert "~100 GB" in line and "still exceeds" in line
    alone = DraftConfig()
    [line] = _target_fit(alone, alone.train, 1, maverick)
    assert line.strip().startswith("!!") and "draft.train.processes" in line
    offline = DraftConfig(hidden_states="offline")
    assert _target_fit(offline, offline.train, 1, maverick) == []
    assert _target_fit(alone, alone.train, 1, 16e9) == []  # an 8B target fits one GPU
