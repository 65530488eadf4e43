"""The tile-shuffled FP8 weight layout and its application to a checkpoint's state dict."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from plugins.common.layout import FP8, LAYOUT_ID, cdiv, shuffle, unshuffle
from trtbuild.core import plugins
from trtbuild.core.errors import UserError


def random_fp8(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(FP8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tile", [(128, 128), (64, 128), (16, 32)])
def test_shuffle_then_unshuffle_is_identity(seed: int, tile: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(seed)
    n, k = (int(v) for v in torch.randint(1, 400, (2,), generator=g))
    w = random_fp8(n, k, seed=seed)
    w4 = shuffle(w, *tile)
    assert w4.shape == (cdiv(n, tile[0]), cdiv(k, tile[1]), *tile)
    assert same_bits(unshuffle(w4, n, k), w)


def test_each_tile_is_contiguous_and_padding_is_zero() -> None:
    n, k, bn, bk = 200, 300, 64, 128  # ragged in both
    w = random_fp8(n, k, seed=1)
    w4 = shuffle(w, bn, bk)
    nt, kt = w4.shape[:2]
    flat = w4.view(torch.uint8).reshape(-1)
    padded = torch.zeros(nt * bn, kt * bk, dtype=torch.uint8)
    padded[:n, :k] = w.view(torch.uint8)
    for tn in range(nt):
        for tk in range(kt):
            start = (tn * kt + tk) * bn * bk  # tile (tn, tk) is one contiguous run of bytes
            tile = flat[start:start + bn * bk].view(bn, bk)
            assert torch.equal(tile, padded[tn * bn:(tn + 1) * bn, tk * bk:(tk + 1) * bk])
    assert int(padded[n:].sum()) == 0 and int(flat.sum()) == int(w.view(torch.uint8).sum(dtype=torch.int64))


def modelopt_like_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors named and typed like ModelOpt's unified FP8 export (2 layers of a tiny Llama)."""
    state: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(50, 96, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(50, 96, dtype=torch.bfloat16),
    }
    for layer in range(2):
        for proj, (n, k) in {"self_attn.q_proj": (96, 96), "self_attn.k_proj": (48, 96),
                             "mlp.gate_proj": (200, 96), "mlp.down_proj": (96, 200)}.items():
            prefix = f"model.layers.{layer}.{proj}"
            state[f"{prefix}.weight"] = random_fp8(n, k, seed=seed + layer)
            state[f"{prefix}.weight_scale"] = torch.tensor(0.01 * (layer + 1))
            state[f"{prefix}.input_scale"] = torch.tensor(0.02)
        state[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(96, dtype=torch.bfloat16)
    return state


def test_transform_state_dict_round_trip_through_safetensors(tmp_path) -> None:
    plugin = plugins.get("gemm_weight_shuffle")
    state = modelopt_like_state()
    out = plugin.transform_weights(state, "sm_90a")
    q = "model.layers.1.mlp.gate_proj.weight"
    assert out[q].shape == (2, 1, 128, 128) and out[q].dtype == FP8
    assert out[q + "_layout"].tolist() == [200, 96, 128, 128]
    # Everything that is not an FP8 linear weight is passed through untouched (same object).
    for name in ("lm_head.weight", "model.embed_tokens.weight", q + "_scale",
                 "model.layers.0.mlp.gate_proj.input_scale"):
        assert out[name] is state[name]
    path = tmp_path / "model.safetensors"
    save_file(out, str(path), metadata=plugin.metadata("sm_90a"))
    loaded = load_file(str(path))
    back = plugin.untransform_weights(loaded)
    assert back.keys() == state.keys()
    for name, tensor in state.items():
        assert same_bits(back[name], tensor), name
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert f.metadata()["trtbuild.weight_layout"] == LAYOUT_ID


def test_transform_is_idempotent_for_one_layout_and_refuses_another() -> None:
    state = modelopt_like_state()
    hopper = plugins.get("spatial_partition").transform_weights(state, "H100")
    again = plugins.get("gemm_weight_shuffle").transform_weights(hopper, "sm_100a")  # same 128x128 tile
    assert all(again[k] is hopper[k] for k in hopper)
    with pytest.raises(UserError, match="already shuffled with tiles 128x128"):
        plugins.get("gemm_weight_shuffle").transform_weights(hopper, "sm_89")


def test_transform_needs_fp8_per_tensor_weights() -> None:
    plugin = plugins.get("gemm_weight_shuffle")
    bf16 = {"model.layers.0.mlp.up_proj.weight": torch.randn(64, 64, dtype=torch.bfloat16)}
    with pytest.raises(UserError, match="found no FP8 linear weights") as err:
        plugin.transform_weights(bf16, "sm_90a")
    assert "quantize" in (err.value.fix or "")
    per_channel = {"a.weight": random_fp8(64, 64), "a.weight_scale": torch.full((64, 1), 0.1)}
    with pytest.raises(UserError, match="needs per-tensor FP8 scales"):
        plugin.transform_weights(per_channel, "sm_90a")
