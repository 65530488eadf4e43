"""The runtime's NVFP4 linear (trtbuild.runtime.nvfp4) is the exact dot product of the NVFP4
activations and weights: bit for bit the same at every row count, equal to an int64 reference,
close to a float64 GEMM of the dequantized tensors, and to ModelOpt's fake-quant linear."""

from __future__ import annotations

import pytest
import torch

from trtbuild.runtime import nvfp4_blocks as nvfp4
from trtbuild.runtime.nvfp4 import ExactNvfp4Linear


def make_linear(n: int, k: int, seed: int, *, worst: bool = False,
                bias: bool = False) -> tuple[ExactNvfp4Linear, torch.Tensor, torch.Tensor]:
    """(linear, float32 weight it came from, input amax). `worst`: every weight of a row +1 or
    -1, all at the largest code (6) and block scale (448): the largest integers the sums can meet."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 0, n).view(n, 1)
    if worst:
        w = torch.ones(n, k) * torch.tensor([1.0, -1.0]).repeat(n // 2 + 1)[:n].view(n, 1)
    q = nvfp4.quantize(w)
    input_amax = torch.tensor(3.0)
    b = torch.randn(n, generator=g) if bias else None
    linear = ExactNvfp4Linear(q.packed, q.weight_scale, q.weight_scale_2, nvfp4.global_scale(input_amax), b)
    return linear, w, input_amax


def int64_reference(linear: ExactNvfp4Linear, x: torch.Tensor) -> torch.Tensor:
    """The same dot products from the dequantized tensors as int64 matrices (no blocks): each
    element A * S as one integer, one int64 GEMM."""
    qx = linear.quantize_input(x)
    codes = nvfp4.unpack(qx.packed).long()
    ax = (nvfp4.E2M1_VALUES[codes] * 2).to(torch.int64).view(qx.packed.shape[0], -1, 16)
    sx = (qx.weight_scale.to(torch.float64) * 512).to(torch.int64).unsqueeze(-1)
    xi = (ax * sx).reshape(ax.shape[0], -1)
    wi = torch.round(linear.dequantized_weight() / linear.weight_scale_2.double() * 1024).to(torch.int64)
    return xi @ wi.t()


@pytest.mark.parametrize("k", [64, 960, 4096])
def test_exact_at_every_row_count(k: int) -> None:
    linear, _, _ = make_linear(48, k, seed=k)
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(1)) * 2
    x[0, :3] = torch.tensor([1e3, -1e3, 1e-9])  # saturating and vanishing inputs
    x[1] = 0.0  # a zero row: every block scale 1.0, every code 0
    full = linear(x)
    for i in range(17):
        assert torch.equal(linear(x[i:i + 1]), full[i:i + 1])
    for rows in (2, 5, 16):
        assert torch.equal(linear(x[:rows]), full[:rows])
    assert torch.equal(linear.exact_sums(x), int64_reference(linear, x))
    assert torch.equal(full, linear.exact_sums(x).double() * linear.out_scale)


def test_worst_case_integers_beyond_float64() -> None:
    """Every weight and input at the largest code and scale: the sums exceed 2^53, where a float64
    GEMM of the same integers may round; the int64 sums stay exact."""
    k = 8192
    linear, _, amax = make_linear(8, k, seed=3, worst=True)
    x = torch.full((3, k), float(amax))
    sums = linear.exact_sums(x)
    assert torch.equal(sums, int64_reference(linear, x))
    assert int(sums.abs().min()) > 2 ** 53  # beyond float64's integers
    assert torch.equal(linear(x[1:2]), linear(x)[1:2])


def test_against_float64_gemm_of_dequantized() -> None:
    linear, _, _ = make_linear(64, 256, seed=5, bias=True)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(2))
    qx = linear.quantize_input(x)
    # exact in float64 (nvfp4.dequantize rounds in float32 as ModelOpt does)
    values = nvfp4.E2M1_VALUES[nvfp4.unpack(qx.packed).long()].double().view(9, -1, 16)
    x_deq = (values * (qx.weight_scale.double() * qx.weight_scale_2.double()).unsqueeze(-1)).view(9, 256)
    want = x_deq @ linear.dequantized_weight().t() + linear.bias
    got = linear(x)
    scale = (x_deq.abs() @ linear.dequantized_weight().abs().t()).max()
    assert (got - want).abs().max() <= 1e-13 * scale


def test_matches_modelopt_fake_quant_linear() -> None:
    """The runtime computes what ModelOpt's NVFP4 fake-quant linear stands for. ModelOpt rounds the
    dequantized weight twice in float32 (block scale x global scale, then x value); the runtime
    keeps it exact, so the two weights agree to one float32 rounding, not bit for bit."""
    nvq = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor").NVFP4QTensor
    linear, w, amax = make_linear(32, 128, seed=9)
    q, s, s2 = nvq.quantize(w.clone(), 16, None, nvfp4.global_scale(w.abs().amax()))
    w_modelopt = q.dequantize(dtype=torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})
    exact = linear.dequantized_weight()
    assert ((exact - w_modelopt.double()).abs() <= 2.0 ** -22 * exact.abs()).all()
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(4))
    x_fake = nvfp4.fake_quantize(x, amax).double()  # ModelOpt's input QDQ (float32 roundings)
    fake = torch.nn.functional.linear(x_fake, w_modelopt.double())
    # the float32 roundings of both operands bound the difference
    bound = 2.0 ** -21 * (x_fake.abs() @ w_modelopt.double().abs().t())
    assert ((linear(x) - fake).abs() <= bound).all()
    assert not torch.equal(linear(x), torch.zeros_like(fake))


def test_bad_shapes_are_refused() -> None:
    q = nvfp4.quantize(torch.randn(4, 32))
    with pytest.raises(ValueError, match="block scales"):
        ExactNvfp4Linear(q.packed, q.weight_scale[:, :1], q.weight_scale_2, torch.tensor(1.0))
