"""The runtime's FP8 linears run the GEMM plugins' op at decode sizes (TRTBUILD_GEMM=reference on CPU)."""

from __future__ import annotations

import pytest
import torch

from trtbuild.runtime.layers import Linear


def _fp8_linear(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k) * 0.05
    sw = (w.abs().amax() / 448.0).float()
    return (w / sw).clamp(-448, 448).to(torch.float8_e4m3fn), sw.reshape(1), torch.tensor(0.01)


@pytest.mark.parametrize("tokens", [1, 5, 16, 17, 40])
def test_plugin_path_matches_the_dequantized_path(monkeypatch: pytest.MonkeyPatch, tokens: int) -> None:
    torch.manual_seed(tokens)
    wq, sw, input_scale = _fp8_linear(300, 200)
    dense = (wq.float() * sw).to(torch.float64)
    monkeypatch.setenv("TRTBUILD_GEMM", "off")
    own = Linear(dense, None, input_scale)
    monkeypatch.setenv("TRTBUILD_GEMM", "reference")
    plugin = Linear(dense, None, input_scale, fp8=(wq, sw))
    assert own.plugin is None and plugin.plugin is not None and plugin.plugin.weight.dim() == 4
    x = torch.randn(1, tokens, 200, dtype=torch.float64)
    y_own, y_plugin = own(x), plugin(x)
    assert y_plugin.shape == (1, tokens, 300) and y_plugin.dtype == torch.float64
    if tokens > 16:  # prefill-sized: the linear's own path, bit for bit
        assert torch.equal(y_plugin, y_own)
    else:  # same FP8 operands; the own path's weight went through float32 dequantization (~1e-8)
        assert float((y_plugin - y_own).abs().max()) <= 1e-6 * float(y_own.abs().max())


def test_cpu_default_keeps_the_dequantized_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRTBUILD_GEMM", raising=False)
    wq, sw, input_scale = _fp8_linear(64, 64)
    assert Linear((wq.float() * sw).double(), None, input_scale, fp8=(wq, sw)).plugin is None


@pytest.mark.parametrize("rows", [1, 2, 5, 7, 8, 9, 48])
def test_float64_gemm_forms_agree_at_every_row_count(rows: int) -> None:
    """gemm_by_rows picks x @ W_t, W @ x^T or x @ W^T by row count; each row's value is the exact dot
    product up to float64 summation order, whatever the form and whatever the other rows are."""
    from trtbuild.runtime.layers import gemm_by_rows

    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 40, generator=g, dtype=torch.float64)
    x = torch.randn(rows, 3, 40, generator=g, dtype=torch.float64)[:, 1]  # a strided view, as callers may pass
    got = gemm_by_rows(x, weight.t().contiguous(), weight)
    exact = (x.unsqueeze(1) * weight.unsqueeze(0)).sum(-1)  # [rows, 96], no BLAS
    assert got.shape == (rows, 96) and got.is_contiguous()
    assert torch.allclose(got, exact, rtol=1e-13, atol=1e-13)
    alone = torch.cat([gemm_by_rows(x[i: i + 1], weight.t().contiguous(), weight) for i in range(rows)])
    assert torch.allclose(got, alone, rtol=1e-13, atol=1e-13)
    linear = Linear(weight.clone())
    assert torch.allclose(linear(x), exact, rtol=1e-13, atol=1e-13)
