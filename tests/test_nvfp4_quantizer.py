"""trtbuild.runtime.nvfp4_blocks against ModelOpt 0.47's own NVFP4QTensor (which runs on CPU): packed values,
block scales and global scale bit for bit, dequantized values bit for bit, on random and
adversarial tensors; and the CPU fake quantization inside ModelOpt's TensorQuantizer."""

from __future__ import annotations

import pytest
import torch

from trtbuild.runtime import nvfp4_blocks as nvfp4

NVFP4QTensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor").NVFP4QTensor

FP8 = torch.float8_e4m3fn
# every e2m1 decision boundary (a tie between two neighbours) and points just beside it
TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def modelopt(x: torch.Tensor, amax: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor]:
    """(packed, weight_scale, weight_scale_2, dequantized) as ModelOpt computes them; with an amax
    the global scale is passed in as its export does (quant_utils.to_quantized_weight)."""
    scale_2 = None if amax is None else NVFP4QTensor.get_weights_scaling_factor_2(amax.reshape(1))
    if scale_2 is not None:
        scale_2 = scale_2.reshape(())
    q, scale, scale_2 = NVFP4QTensor.quantize(x.clone(), 16, None, scale_2)
    deq = q.dequantize(dtype=x.dtype, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
    return q._quantized_data, scale, scale_2, deq


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same(x: torch.Tensor, amax: torch.Tensor | None = None) -> nvfp4.NVFP4Weight:
    packed, scale, scale_2, deq = modelopt(x, amax)
    mine = nvfp4.quantize(x, amax)
    assert mine.packed.dtype == torch.uint8 and mine.weight_scale.dtype == FP8
    assert torch.equal(mine.packed, packed)
    assert torch.equal(mine.weight_scale.view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(bits(mine.weight_scale_2), bits(scale_2.float()))
    got = nvfp4.dequantize(mine)
    assert got.dtype == deq.dtype
    assert torch.equal(bits(got), bits(deq))  # -0 and +0 told apart
    if amax is not None:
        assert torch.equal(bits(nvfp4.fake_quantize(x, amax)), bits(deq))
    return mine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(4))
def test_random_weights(dtype: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    # rows of very different magnitudes, so block scales span the e4m3 range (subnormals included)
    x = (torch.randn(96, 160, generator=g) * torch.logspace(-4, 1, 96).view(96, 1)).to(dtype)
    assert_same(x)  # the tensor's own amax
    assert_same(x, x.abs().amax().float())  # a calibrated amax equal to it (weights)
    assert_same(x, x.abs().amax().float() * 3.0)  # a calibration that saw more
    assert_same(x, x.abs().amax().float() / 50.0)  # saw less: block scales saturate at 448
    assert_same(x.reshape(4, 24, 160))  # an expert stack: blocks stay along the last dim


def test_every_tie_and_neighbour() -> None:
    """Blocks whose scale is exactly S * g (g a power of two, S an e4m3 value), so x / scale
    lands exactly on each e2m1 boundary and one float32 step either side of it."""
    g = 2.0 ** -12
    amax = torch.tensor(2688.0 * g)  # global scale exactly g
    rows = []
    for s_code in (0x01, 0x07, 0x08, 0x30, 0x38, 0x55, 0x7E):  # subnormal 2^-9 .. 448
        s = torch.tensor(s_code, dtype=torch.uint8).view(FP8).float().item()
        for ties in ([t for t in TIES], [torch.nextafter(torch.tensor(t), torch.tensor(0.0)).item() for t in TIES],
                     [torch.nextafter(torch.tensor(t), torch.tensor(9.0)).item() for t in TIES]):
            row = torch.tensor([6.0, *ties, *[-t for t in ties], 0.0], dtype=torch.float32)[:16]
            rows.append(row * (s * g))
    x = torch.stack(rows)
    mine = assert_same(x, amax)
    # the ties really were ties: the scale came out as S exactly and the codes round to even
    codes = nvfp4.unpack(mine.packed)[0, 1:8]
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6]


def test_zeros_tiny_and_huge_blocks() -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(7))
    x[0] = 0.0  # all-zero blocks: scale 1.0 (e4m3 0x38)
    x[1, :16] = 1e-30  # below the smallest block scale: clamped up to 2^-9
    x[1, 16:32] = -1e-30
    x[2, :16] = torch.linspace(-1e-6, 1e-6, 16)  # e4m3 subnormal scales
    x[3, :16] = 1e6  # one block far above the rest, the tensor amax
    x[4, 5] = -0.0
    mine = assert_same(x)
    assert mine.weight_scale.view(torch.uint8)[0].tolist() == [0x38] * 4
    assert mine.weight_scale.view(torch.uint8)[1, 0].item() == 0x01
    assert_same(x, torch.tensor(1.0))  # the big block saturates (scale 448, values 6)


def test_huge_and_bf16_extremes() -> None:
    x = torch.randn(16, 48, generator=torch.Generator().manual_seed(3)) * 1e30
    assert_same(x)
    y = torch.tensor([[3.3895e38, -3.3895e38] + [1e-38] * 14], dtype=torch.bfloat16)
    assert_same(y)


def test_padding_to_a_block() -> None:
    """A last dim that is not a multiple of 16 is padded with zeros before quantizing, as ModelOpt does."""
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(11))
    q, scale, _ = NVFP4QTensor.quantize(x.clone(), 16)  # its dequantize cannot undo the padding
    packed = q._quantized_data
    mine = nvfp4.quantize(x)
    assert mine.packed.shape == (5, 24)
    assert torch.equal(mine.packed, packed) and torch.equal(mine.weight_scale.view(torch.uint8), scale.view(torch.uint8))
    assert nvfp4.dequantize(mine).shape == x.shape


def test_zero_amax_is_refused() -> None:
    """ModelOpt 0.47 writes NaN scales for an all-zero tensor (0 / 0); trtbuild refuses it."""
    _, scale, _, _ = modelopt(torch.zeros(2, 16), None)
    assert torch.isnan(scale.float()).all()
    with pytest.raises(ValueError, match="finite, positive amax"):
        nvfp4.quantize(torch.zeros(2, 16))


def test_tensor_quantizer_on_cpu() -> None:
    """ModelOpt's TensorQuantizer with NVFP4_DEFAULT_CFG's weight attributes asserts CUDA on CPU;
    inside cpu_fake_quant it returns ModelOpt's dequantize(quantize(x)) for its calibrated amax."""
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    attrs = {"num_bits": (2, 1), "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)},
             "axis": None, "enable": True}
    quantizer = TensorQuantizer(QuantizerAttributeConfig(**attrs))
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(5))
    quantizer.amax = x.abs().amax() * 0.8
    with pytest.raises(AssertionError, match="CUDA"):
        quantizer(x)
    with nvfp4.cpu_fake_quant():
        got = quantizer(x)
    *_, deq = modelopt(x, quantizer.amax.float())
    assert torch.equal(bits(got), bits(deq))
    with pytest.raises(AssertionError, match="CUDA"):  # the patch is gone again
        quantizer(x)
