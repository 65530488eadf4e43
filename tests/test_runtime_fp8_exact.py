"""The CPU runtime's FP8 GEMM (trtbuild.runtime.fp8_exact) is the exact dot product of the FP8
operands, bit for bit at any row count, on both backends; a weight off the FP8 grid falls back."""

from __future__ import annotations

import pytest
import torch

from trtbuild.runtime import fp8_exact
from trtbuild.runtime.layers import Linear, LinearParts, fuse_linears

FP8 = torch.float8_e4m3fn


def fp8_weight(n: int, k: int, seed: int, per_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, float32 scale [n]) with the extremes in it: +-448, subnormals, zeros."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 0, n).view(n, 1)
    scale = w.abs().amax(1) / 448.0 if per_row else (w.abs().amax() / 448.0).expand(n)
    q = (w / scale.view(n, 1)).clamp(-448, 448).to(FP8)
    q.view(torch.uint8)[0, :4] = torch.tensor([0x7E, 0xFE, 0x01, 0x00], dtype=torch.uint8)  # 448, -448, 2^-9, 0
    return q, scale.float().contiguous()


def exact_reference(x: torch.Tensor, inv: torch.Tensor, q_w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The same quantity in int64: fp8(x * inv) . w as integers of 2^-9 units, then the scales."""
    q_x = (x.to(torch.float64) * inv.double()).clamp(-448, 448).to(FP8)
    ints_x = (q_x.to(torch.float64) * 512).to(torch.int64)
    ints_w = (q_w.to(torch.float64) * 512).to(torch.int64)
    dot = ints_x @ ints_w.t()  # exact
    return dot.to(torch.float64) * (scale.double() / inv.double() / 2.0 ** 18)


@pytest.fixture(params=["onednn", "int_mm"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "onednn":
        if not fp8_exact._onednn_exact():
            pytest.skip("oneDNN's int8 GEMM is not exact on this CPU (the runtime uses torch._int_mm)")
    else:
        if not fp8_exact._int_mm_exact():
            pytest.skip("torch._int_mm is not exact on this CPU (the runtime keeps the float64 path)")
        monkeypatch.setattr(fp8_exact, "_onednn_exact", lambda: False)
    return request.param


# Tests that build Linear expect the exact path; a CPU whose int8 GEMMs fail the self-check (the
# runtime then keeps float64, tested elsewhere) has nothing here to test.
needs_exact = pytest.mark.skipif(not fp8_exact.available(), reason="no exact int8 GEMM on this CPU")


@pytest.mark.parametrize("per_row", [False, True], ids=["per-tensor", "per-row"])
@pytest.mark.parametrize("k", [64, 1536, 2304])
def test_products_are_exact_at_every_row_count(backend: str, per_row: bool, k: int) -> None:
    q_w, scale = fp8_weight(48, k, seed=k, per_row=per_row)
    inv = torch.tensor(448.0 / (0.02 * 448.0), dtype=torch.float64)
    gemm = fp8_exact.ExactFp8Gemm(q_w, scale, inv)
    assert (gemm.packed is not None) == (backend == "onednn" and k <= fp8_exact.ONEDNN_MAX_K)
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[0, :3] = torch.tensor([1e3, -1e3, 1e-9])  # saturating and subnormal inputs
    want = exact_reference(x, inv, q_w, scale)
    for rows in (1, 2, 5, fp8_exact.ROWS_FOR_FLOAT64 - 1):  # the int8 plane GEMMs
        got = gemm(x[:rows])
        assert torch.equal(got, want[:rows]), rows  # bit for bit: the sums are exact integers
    assert gemm.grid64_t is None  # decode-sized calls never make the weight's float64 copy
    for rows in (fp8_exact.ROWS_FOR_FLOAT64, 17):  # the float64 GEMM of the same integers
        assert torch.equal(gemm(x[:rows]), want[:rows]), rows
    assert gemm.grid64_t is not None
    assert torch.equal(gemm(x.view(1, 17, k)), want.view(1, 17, 48))


@needs_exact
def test_both_backends_and_the_float64_fold_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    q_w, scale = fp8_weight(40, 320, seed=3)
    input_scale = torch.tensor(0.02)
    inv = (448.0 / (input_scale * 448.0)).double()  # as Linear computes it from the input scale
    x = torch.randn(6, 320, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    fast = fp8_exact.ExactFp8Gemm(q_w, scale, inv)(x)
    monkeypatch.setattr(fp8_exact, "_onednn_exact", lambda: False)
    slow = fp8_exact.ExactFp8Gemm(q_w, scale, inv)(x)
    assert torch.equal(fast, slow)
    # the float64 path it replaces (dequantized weight, input dequant folded in) differs by rounding only
    dequantized = (q_w.float() * scale.view(-1, 1)).double()  # rounded to float32: 2^-24 per weight
    folded = Linear(dequantized, None, input_scale)
    assert folded.exact is None
    bound = 2.0 ** -22 * (x.abs() @ dequantized.abs().t())  # that rounding's bound, with room for FP8's
    assert ((folded(x) - fast).abs() <= bound).all()
    assert not torch.equal(folded(x), fast)  # not the same computation


@needs_exact
def test_linear_recovers_the_grid_and_refuses_weights_off_it() -> None:
    q_w, scale = fp8_weight(32, 64, seed=4, per_row=True)
    dense = (q_w.float() * scale.view(-1, 1)).double()  # as trtbuild.runtime.checkpoint dequantizes
    input_scale = torch.tensor(0.05)
    on_grid = Linear(dense, None, input_scale, scale)
    assert on_grid.exact is not None and torch.equal(on_grid.exact.grid.view(torch.uint8), q_w.view(torch.uint8))
    assert torch.allclose(on_grid.weight, dense * input_scale.double(), rtol=1e-15)
    off_grid = dense.clone()
    off_grid[3, 5] *= 1.0001
    assert Linear(off_grid, None, input_scale, scale).exact is None  # the float64 path instead
    assert Linear(dense, None, input_scale).exact is None  # no weight scale: no grid to recover


@needs_exact
def test_fused_parts_keep_each_parts_scale() -> None:
    """q|k|v with their own weight scales fuse into one exact GEMM equal to the three apart."""
    parts = []
    for i, n in enumerate((24, 8, 8)):
        q_w, scale = fp8_weight(n, 48, seed=10 + i)
        parts.append(LinearParts((q_w.float() * scale.view(-1, 1)).double(), None, torch.tensor(0.03), scale[:1]))
    [fused] = fuse_linears(parts)
    assert fused.exact is not None and fused.out_features == 40
    x = torch.randn(3, 48, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    apart = torch.cat([Linear(*part)(x) for part in parts], -1)
    assert torch.equal(fused(x), apart)


def test_the_self_check_fails_a_saturating_kernel() -> None:
    """The worst-case operands the backends are checked on catch int8 instructions that saturate
    (u8 x s8 pairs summed into int16, as AVX2 without VNNI does), so such a CPU falls back."""
    inputs, weights = fp8_exact._worst_case(256)
    u8 = inputs.to(torch.int64) + fp8_exact.U8_OFFSET
    pairs = (u8.view(u8.shape[0], 1, -1, 2) * weights.to(torch.int64).view(1, weights.shape[0], -1, 2)).sum(-1)
    saturated = pairs.clamp(-32768, 32767).sum(-1) - fp8_exact.U8_OFFSET * weights.to(torch.int64).sum(-1)
    exact = inputs.to(torch.int64) @ weights.to(torch.int64).t()
    assert not torch.equal(saturated, exact)
