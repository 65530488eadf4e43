"""The FSDP2 target built on the meta device and read shard by shard (draft/sharded_load.py) is the
target a whole load gives. One gloo rank here; two ranks, each reading half of every layer, run in
tests/test_draft_distributed.py (slow)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from draft_fixtures import write_target
from safetensors.torch import load_file, save_file

from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target
from trtbuild.draft.sharded_load import build_sharded_target

ARCH = DraftArch(aux_layers=[0, 2], draft_vocab_size=384)


@pytest.fixture
def one_rank() -> Iterator[None]:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-embeddings"])
def test_the_meta_built_target_is_the_loaded_one(tmp_path: Path, one_rank: None, tied: bool) -> None:
    hf = write_target(tmp_path / "hf", tie_word_embeddings=tied)
    reference = convert_to_eagle3(load_target(hf), ARCH, None)
    init = {k: v.detach().clone().float() for k, v in reference.eagle_module.state_dict().items()}
    model, stats = build_sharded_target(hf, torch.float32, ARCH, init, "cpu")

    assert stats["target_layer_parameters_per_rank"] == stats["target_layer_parameters"] > 0
    checkpoint = load_file(str(hf / "model.safetensors"))
    assert stats["target_bytes_read_per_rank"] == sum(t.numel() * t.element_size() for t in checkpoint.values())
    got = dict(model.named_parameters())
    for name, param in reference.named_parameters():
        assert torch.equal(whole(got[name]).detach(), param.detach().float()), name
    for name, buffer in reference.named_buffers():  # RoPE's inverse frequencies are computed, not read
        assert torch.equal(dict(model.named_buffers())[name], buffer), name
    assert not any(p.is_meta for p in model.parameters())
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.model(ids).last_hidden_state, reference.model(ids).last_hidden_state)


def test_a_tensor_missing_from_the_checkpoint_is_named(tmp_path: Path, one_rank: None) -> None:
    hf = write_target(tmp_path / "hf")
    state = load_file(str(hf / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(hf / "model.safetensors"))
    init = {k: v.detach().clone() for k, v in convert_to_eagle3(load_target(write_target(tmp_path / "ok")), ARCH,
                                                                 None).eagle_module.state_dict().items()}
    with pytest.raises(RuntimeError, match="no tensor 'model.layers.1.mlp.up_proj.weight'"):
        build_sharded_target(hf, torch.float32, ARCH, init, "cpu")
