"""NVFP4 on CPU: ModelOpt 0.47's block quantization, its export layout, and a CPU fake quantizer.

NVFP4 stores a weight as e2m1 values (magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6) in blocks of 16
along the input dimension, one FP8 e4m3 scale per block, and one float32 scale per tensor:

    weight_scale_2 = amax / (6 * 448)                                   (float32)
    weight_scale   = e4m3(clamp(block_amax / (6 * weight_scale_2), 2^-9, 448)), 1.0 for a zero block
    code           = e2m1(x / (float32(weight_scale) * weight_scale_2))  (nearest, ties to even mantissa)
    packed byte    = code[2i] | code[2i + 1] << 4                        (uint8, half the input dim)
    dequantized    = float32(e2m1 value) * (float32(weight_scale) * weight_scale_2)

Read from nvidia-modelopt 0.47.0 (the wheel in .venv):
modelopt/torch/quantization/qtensor/nvfp4_tensor.py (`NVFP4QTensor.get_weights_scaling_factor_2`,
`get_weights_scaling_factor`, `_cast_per_block_scale_to_fp8`, `_cast_fp4`, `quantize`, `dequantize`)
and modelopt/torch/export/quant_utils.py (`to_quantized_weight` packs with `NVFP4QTensor.quantize`
given the calibrated `weight_scale_2 = _amax / (6 * 448)`). Every float operation below is the one
ModelOpt performs, in the same order and precision, so the results are equal bit for bit
(tests/test_nvfp4_quantizer.py checks it against `NVFP4QTensor` itself, which runs on CPU). The
e2m1 rounding is written as the threshold comparisons of ModelOpt's Triton kernel
(modelopt/torch/kernels/quantization/common/nvfp4_quant.py `fp4_round_magnitude`) rather than
`_cast_fp4`'s searchsorted, so the test compares two different formulations of the rule.

ModelOpt's *fake* quantization (`tensor_quant._dynamic_block_quantize_impl`, used by every
NVFP4 TensorQuantizer in `mtq.NVFP4_DEFAULT_CFG`) asserts `amax.is_cuda`; `cpu_fake_quant()`
substitutes `fake_quantize` (dequantize(quantize(x))) for that one function on CPU tensors.

What of ModelOpt runs on CPU (checked here): `NVFP4QTensor.quantize`, `.dequantize` (not with
`fast=True`, a Triton kernel), `get_weights_scaling_factor(_2)`, `get_activation_scaling_factor` and
the HF export; not: a TensorQuantizer's forward with NVFP4 attributes (the assert above). On a GPU,
ModelOpt's fake quantization runs the Triton kernel `fp4_fake_quant_block`
(modelopt/torch/kernels/quantization/gemm/fp4_kernel_hopper.py), which differs from NVFP4QTensor
at the edges (read, not run): no lower clamp of block scales at 2^-9, and a block whose
dequantization scale is below 1e-5 gets scale 1.0 (its values round to 0). This module follows
NVFP4QTensor, the arithmetic of the export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_MIN_SCALE = 2.0 ** -9  # the smallest e4m3 subnormal: ModelOpt clamps block scales up to it
FP8 = torch.float8_e4m3fn
# code -> value: bit 3 is the sign, bits 0-2 index the magnitudes; code 8 is +0 as in ModelOpt's table
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                           dtype=torch.float32)


@dataclass(frozen=True)
class NVFP4Weight:
    """One tensor in ModelOpt's export layout."""

    packed: torch.Tensor  # uint8 [..., K // 2]
    weight_scale: torch.Tensor  # float8_e4m3fn [..., K // 16]
    weight_scale_2: torch.Tensor  # float32 scalar
    shape: tuple[int, ...]  # the original shape (K before padding to 16)
    dtype: torch.dtype


def global_scale(amax: torch.Tensor) -> torch.Tensor:
    """weight_scale_2 (or input_scale) of a tensor whose calibrated amax is `amax`."""
    return amax.float() / (E2M1_MAX * E4M3_MAX)


def _pad(x: torch.Tensor, block_size: int) -> torch.Tensor:
    rest = x.shape[-1] % block_size
    return x if rest == 0 else torch.nn.functional.pad(x, (0, block_size - rest))


def block_scales(x: torch.Tensor, scale_2: torch.Tensor, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """The e4m3 scale of each block of `x` (last dim a multiple of block_size)."""
    blocks = x.reshape(*x.shape[:-1], -1, block_size)
    block_amax = blocks.abs().amax(dim=-1).float()
    scale = block_amax / (E2M1_MAX * scale_2.to(block_amax.device))
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale.clamp(min=E4M3_MIN_SCALE, max=E4M3_MAX).to(FP8)


def e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8, 0-15) of float32 values already divided by their block scale.

    Nearest e2m1 magnitude; a tie goes to the even mantissa (0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
    1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); beyond 6 saturates. The sign bit is set for values
    below zero, -0 included as ModelOpt does (a tiny negative value becomes code 8)."""
    a = scaled.abs()
    magnitude = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5)
                 + (a >= 3.5) + (a > 5.0))
    return magnitude.to(torch.uint8) | ((scaled < 0).to(torch.uint8) << 3)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Two codes a byte: element 2i in the low nibble, 2i + 1 in the high one."""
    return (codes[..., 1::2] << 4) | codes[..., 0::2]


def unpack(packed: torch.Tensor) -> torch.Tensor:
    codes = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.uint8, device=packed.device)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes


def quantize(x: torch.Tensor, amax: torch.Tensor | None = None, block_size: int = BLOCK_SIZE,
             weight_scale: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> NVFP4Weight:
    """NVFP4-quantize `x` along its last dim. amax: the calibrated (per-tensor) amax; None takes
    the tensor's own, as `NVFP4QTensor.quantize` without weights_scaling_factor_2 does. scale_2:
    the global scale itself instead (an exported weight_scale_2 / input_scale)."""
    shape, dtype = tuple(x.shape), x.dtype
    x = _pad(x, block_size)
    if scale_2 is None:
        amax = x.abs().amax() if amax is None else amax
        if not bool(torch.isfinite(amax).all()) or not bool((amax > 0).all()):
            # ModelOpt 0.47 divides 0 by 0 here and writes NaN scales (code 7, i.e. 6 * NaN)
            raise ValueError(f"NVFP4 needs a finite, positive amax; got {amax.tolist()}")
        scale_2 = global_scale(amax)
    elif not bool(torch.isfinite(scale_2).all()) or not bool((scale_2 > 0).all()):
        raise ValueError(f"NVFP4 needs a finite, positive global scale; got {scale_2.tolist()}")
    scale_2 = scale_2.float()
    if weight_scale is None:
        weight_scale = block_scales(x, scale_2, block_size)
    blocks = x.reshape(*x.shape[:-1], -1, block_size)
    scaled = blocks / (weight_scale.to(torch.float32) * scale_2).unsqueeze(-1)
    codes = e2m1_codes(scaled.reshape(x.shape))
    return NVFP4Weight(pack(codes), weight_scale, scale_2, shape, dtype)


def dequantize(q: NVFP4Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The values `q` stands for, as `NVFP4QTensor.dequantize` computes them (float32, then dtype)."""
    codes = unpack(q.packed)
    values = E2M1_VALUES.to(codes.device)[codes.long()]
    block_size = values.shape[-1] // q.weight_scale.shape[-1]
    scale = q.weight_scale.to(torch.float32) * q.weight_scale_2
    out = values.reshape(*values.shape[:-1], -1, block_size) * scale.unsqueeze(-1)
    out = out.reshape(values.shape)[..., :q.shape[-1]].reshape(q.shape)
    return out.to(q.dtype if dtype is None else dtype)


def fake_quantize(x: torch.Tensor, amax: torch.Tensor, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """dequantize(quantize(x, amax)) in x's dtype and shape: what ModelOpt's NVFP4 QDQ stands for."""
    return dequantize(quantize(x, amax.reshape(-1).amax() if amax.numel() != 1 else amax, block_size))


# --- ModelOpt's flow on CPU ---------------------------------------------------------------------

def _is_nvfp4(num_bits: int, exponent_bits: int, scale_num_bits: int, scale_exponent_bits: int) -> bool:
    """The op's integer arguments for e2m1 values with e4m3 scales (tensor_quant.py encodes
    num_bits (2, 1) as 4 bits with 2 exponent bits, scale_bits (4, 3) as 8 with 4)."""
    return (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (4, 2, 8, 4)


@contextlib.contextmanager
def cpu_fake_quant() -> Iterator[None]:
    """Within the block, ModelOpt's dynamic NVFP4 block fake quantization of CPU tensors runs
    `fake_quantize` instead of asserting CUDA.

    The one function replaced is `modelopt.torch.quantization.tensor_quant.dynamic_block_quantize_op`
    (the module global `_dynamic_block_quantize_forward` calls: `torch.ops.tensorrt.dynamic_block_quantize_op`,
    i.e. `_dynamic_block_quantize_impl`). CUDA tensors and every other format still go to it."""
    from modelopt.torch.quantization import tensor_quant

    original = tensor_quant.dynamic_block_quantize_op

    def op(inputs: torch.Tensor, block_size: int, amax: torch.Tensor | None, num_bits: int,
           exponent_bits: int, scale_num_bits: int, scale_exponent_bits: int) -> Any:
        if (not inputs.is_cuda and amax is not None
                and _is_nvfp4(num_bits, exponent_bits, scale_num_bits, scale_exponent_bits)):
            if inputs.shape[-1] % block_size:
                raise ValueError(f"NVFP4 block quantization of a last dim of {inputs.shape[-1]}: "
                                 f"not a multiple of the block size {block_size}")
            return fake_quantize(inputs, amax.to(inputs.device), block_size)
        return original(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits,
                        scale_exponent_bits)

    tensor_quant.dynamic_block_quantize_op = op
    try:
        yield
    finally:
        tensor_quant.dynamic_block_quantize_op = original
