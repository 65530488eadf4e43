"""Reads safetensors weights of a Hugging Face directory (single file or sharded), FP8-aware."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trtbuild.core.errors import UserError
from trtbuild.runtime.layers import LinearParts
from trtbuild.runtime.nvfp4 import ExactNvfp4Linear


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError("bad safetensors index (no weight_map)", file=str(index)) from None
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UserError("no *.safetensors weights in the model directory", file=str(model_dir),
                        fix="only safetensors checkpoints are loaded")
    return files


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in weight_files(model_dir):
        if not path.is_file():
            raise UserError("weight file named in the index is missing", file=str(path))
        state.update(load_file(str(path)))
    return state


class Weights:
    """A state dict with the lookups the model builders need; every read is checked."""

    def __init__(self, state: dict[str, torch.Tensor], source: Path, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.state = state
        self.source = source
        self.dtype = dtype
        self.device = torch.device(device)

    def has(self, name: str) -> bool:
        return name in self.state

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        try:
            tensor = self.state[name]
        except KeyError:
            raise UserError(f"checkpoint lacks tensor {name!r}", file=str(self.source)) from None
        if shape is not None and tuple(tensor.shape) != shape:
            raise UserError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}",
                            file=str(self.source))
        return tensor

    def float(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        return self.get(name, shape).to(self.device, self.dtype)

    def optional(self, name: str) -> torch.Tensor | None:
        return self.state[name].to(self.device, self.dtype) if name in self.state else None

    def linear(self, prefix: str, out_features: int, in_features: int) -> LinearParts:
        """(weight in compute dtype, bias, input_scale, weight_scale) of `prefix`.{weight,...}.

        FP8 weights are dequantized with their `weight_scale` (per tensor or per output row),
        which is returned too: on CPU the runtime recovers the FP8 grid from the two.
        """
        if self.is_nvfp4(prefix):
            return self.nvfp4_linear(prefix, out_features, in_features)
        weight = self.get(f"{prefix}.weight", (out_features, in_features))
        input_scale = scale = None
        if weight.dtype == torch.float8_e4m3fn:
            scale = self.get(f"{prefix}.weight_scale").to(torch.float32)
            if scale.numel() == 1:
                scale = scale.reshape(())
            elif scale.numel() == out_features:
                scale = scale.reshape(out_features, 1)
            else:
                raise UserError(f"{prefix}.weight_scale has shape {tuple(scale.shape)}; per-tensor or "
                                "per-row scales are supported", file=str(self.source))
            weight = weight.to(torch.float32) * scale
            if f"{prefix}.input_scale" in self.state:
                input_scale = self.state[f"{prefix}.input_scale"].to(self.device, torch.float32).reshape(())
        elif weight.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise UserError(f"{prefix}.weight has dtype {weight.dtype}; the runtime reads float and "
                            "float8_e4m3fn weights", file=str(self.source))
        bias = self.optional(f"{prefix}.bias")
        return LinearParts(weight.to(self.device, self.dtype), bias, input_scale, scale)

    def is_nvfp4(self, prefix: str) -> bool:
        """ModelOpt's NVFP4 export of a linear: packed uint8 weight with a weight_scale_2."""
        weight = self.state.get(f"{prefix}.weight")
        return weight is not None and weight.dtype == torch.uint8 and f"{prefix}.weight_scale_2" in self.state

    def nvfp4_linear(self, prefix: str, out_features: int, in_features: int) -> LinearParts:
        """An NVFP4 linear (packed [out, in/2] uint8, e4m3 weight_scale [out, in/16], float32
        weight_scale_2 and input_scale) as the exact W4A4 linear of trtbuild.runtime.nvfp4."""
        packed = self.get(f"{prefix}.weight", (out_features, in_features // 2))
        scale = self.get(f"{prefix}.weight_scale")
        if scale.dtype != torch.float8_e4m3fn or f"{prefix}.input_scale" not in self.state:
            raise UserError(f"{prefix}: NVFP4 weight with a {scale.dtype} weight_scale and "
                            f"{'an' if f'{prefix}.input_scale' in self.state else 'no'} input_scale; the runtime "
                            "reads ModelOpt's NVFP4 export (float8_e4m3fn block scales, a static input_scale)",
                            file=str(self.source))
        try:
            exact = ExactNvfp4Linear(packed.cpu(), scale.cpu(), self.get(f"{prefix}.weight_scale_2"),
                                     self.get(f"{prefix}.input_scale"))
        except ValueError as err:
            raise UserError(f"{prefix}: {err}", file=str(self.source)) from None
        weight = exact.dequantized_weight().to(self.device, self.dtype)
        return LinearParts(weight, self.optional(f"{prefix}.bias"), None, None, exact)

    def fp8(self, prefix: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(float8 weight, per-tensor weight_scale) of an FP8 linear, else None."""
        weight = self.state.get(f"{prefix}.weight")
        scale = self.state.get(f"{prefix}.weight_scale")
        if weight is None or weight.dtype != torch.float8_e4m3fn or scale is None or scale.numel() != 1:
            return None
        return weight, scale.to(torch.float32)

    def kv_scale(self, name: str) -> torch.Tensor | None:
        if name not in self.state:
            return None
        return self.state[name].to(self.device, torch.float32).reshape(())
