"""Each plugin's Triton kernel (interpreter, TRITON_INTERPRET=1) against its torch reference.

Shapes are random and ragged: M in 1..16 (plus multi-tile M), N and K not multiples of the tile.
Operands are quantized to e4m3 in torch (the interpreter misrounds fp32->fp8 inside kernels).
"""

from __future__ import annotations

import pytest
import torch

from plugins.common.layout import FP8, shuffle
from plugins.common.reference import fp8_gemm_reference, quantize_fp8
from trtbuild.core import plugins

PLUGINS = plugins.available()


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def operands(m: int, n: int, k: int, tile: tuple[int, int], seed: int):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    w_real = torch.randn(n, k, generator=g) * 0.05
    x_real = torch.randn(m, k, generator=g)
    sw = (w_real.abs().amax() / 448).float()
    sx = (x_real.abs().amax() / 448).float()
    w = quantize_fp8(w_real, sw)
    x = quantize_fp8(x_real, sx)
    return x, w, shuffle(w, *tile), sx, sw


def ragged_shapes(seed: int, count: int) -> list[tuple[int, int, int]]:
    g = torch.Generator().manual_seed(seed)
    shapes = []
    for _ in range(count):
        m = int(torch.randint(1, 17, (1,), generator=g))
        n = int(torch.randint(1, 300, (1,), generator=g))
        k = int(torch.randint(1, 400, (1,), generator=g))
        shapes.append((m, n, k))
    return shapes


@pytest.mark.parametrize("name", PLUGINS)
@pytest.mark.parametrize(("m", "n", "k"), [*ragged_shapes(0, 5), (16, 128, 256), (1, 129, 257)])
def test_kernel_matches_reference_fp32(name: str, m: int, n: int, k: int) -> None:
    plugin = plugins.get(name)
    x, w, w4, sx, sw = operands(m, n, k, plugin.tile_for("sm_90a"), seed=m * 1000 + n + k)
    y = plugin.kernel(x, w4, sx, sw, n, k, torch.float32)
    ref = plugin.reference(x, w4, sx, sw, n, k, torch.float32)
    scale = float(ref.abs().max()) + 1e-12
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * scale)
    # The reference itself against a dense product of the unshuffled weight.
    dense = (x.float() @ w.float().t()) * (sx * sw)
    torch.testing.assert_close(ref, dense, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("name", PLUGINS)
@pytest.mark.parametrize("split_k", [None, 1, 3])
def test_split_k_and_bf16_output(name: str, split_k: int | None) -> None:
    plugin = plugins.get(name)
    m, n, k = 5, 250, 700  # 6 K tiles: split 3 -> 2 tiles each; the heuristic splits too
    x, _, w4, sx, sw = operands(m, n, k, plugin.tile_for("sm_100a"), seed=7)
    y = plugin.kernel(x, w4, sx, sw, n, k, torch.bfloat16, split_k=split_k)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    ref = plugin.reference(x, w4, sx, sw, n, k, torch.float32)
    torch.testing.assert_close(y.float(), ref, rtol=8e-3, atol=1e-3 * float(ref.abs().max()))


@pytest.mark.parametrize("name", PLUGINS)
def test_many_token_tiles_and_leading_dims(name: str) -> None:
    plugin = plugins.get(name)
    m, n, k = 70, 140, 130  # BLOCK_M 64: two token tiles, the second ragged
    x, _, w4, sx, sw = operands(m, n, k, plugin.tile_for("sm_90a"), seed=3)
    y = plugin.kernel(x.view(2, 35, k), w4, sx, sw, n, k, torch.float32)
    assert y.shape == (2, 35, n)
    ref = plugin.reference(x, w4, sx, sw, n, k, torch.float32)
    torch.testing.assert_close(y.reshape(m, n), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_other_arch_tiles_and_out_buffer() -> None:
    plugin = plugins.get("gemm_weight_shuffle")
    m, n, k = 9, 100, 300
    x, _, w4, sx, sw = operands(m, n, k, plugin.tile_for("sm_89"), seed=11)  # 64x128 tiles
    out = torch.full((m, n), float("nan"), dtype=torch.float32)
    y = plugin.kernel(x, w4, sx, sw, n, k, out=out)
    assert y.data_ptr() == out.data_ptr()  # TensorRT plugins hand in their output buffer
    ref = fp8_gemm_reference(x, w4, sx, sw, n, k, torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_torch_op_on_cpu_is_the_reference() -> None:
    for name in PLUGINS:
        plugin = plugins.get(name)
        m, n, k = 3, 96, 160
        x, _, w4, sx, sw = operands(m, n, k, plugin.tile_for("sm_90a"), seed=5)
        y = plugin.torch_op(x, w4, sx, sw, n, k, torch.bfloat16)
        assert torch.equal(y, plugin.reference(x, w4, sx, sw, n, k, torch.bfloat16))
        assert plugin.torch_op is getattr(torch.ops.trtbuild, plugin.torch_op_name.split("::")[1])
        # The fake (meta) kernel agrees with the real one (what torch.compile relies on).
        torch.library.opcheck(plugin.torch_op.default, (x, w4, sx, sw, n, k, torch.float32),
                              test_utils=("test_faketensor",))


def test_bad_operands_are_rejected() -> None:
    plugin = plugins.get("gemm_weight_shuffle")
    x, _, w4, sx, sw = operands(2, 64, 64, (64, 64), seed=0)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        plugin.kernel(x.float(), w4, sx, sw, 64, 64)
    with pytest.raises(ValueError, match="expects 64"):
        plugin.kernel(x[:, :32], w4, sx, sw, 64, 64)
    with pytest.raises(ValueError, match="does not hold"):
        plugin.kernel(x, w4, sx, sw, 200, 64)
    with pytest.raises(ValueError, match="per-tensor"):
        plugin.kernel(x, w4, torch.ones(2), sw, 64, 64)
    # TMA (spatial_partition) needs a 16-byte aligned weight: an offset view is refused, not read.
    raw = torch.zeros(w4.numel() + 1, dtype=torch.uint8)
    raw[1:] = w4.view(torch.uint8).reshape(-1)
    misaligned = raw[1:].view(FP8).view(w4.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        plugins.get("spatial_partition").kernel(x, misaligned, sx, sw, 64, 64)
