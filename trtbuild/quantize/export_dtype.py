"""A CPU quantization computes in float32; the export keeps the checkpoint's own dtype.

On a CPU, ModelOpt calibrates and scores a bf16 checkpoint in float32 (bf16 matmuls are slow
there, and bf16 rounding in both the fake-quant reference and the runtime made the export check
compare two independent bf16 noises, 0.75x the quantization effect on SmolLM2-135M). Loading
bf16 weights into float32 is exact, so casting the export's float32 tensors back is exact too:
FP8 weights and their float32 scales stay as ModelOpt wrote them, every other tensor (norms,
embeddings, an excluded lm_head) returns to the checkpoint's dtype, and config.json says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SCALE_SUFFIXES = ("_scale", "_scale_2", ".k_scale", ".v_scale")  # _scale_2: NVFP4's per-tensor scale


def checkpoint_dtype(model_dir: Path) -> torch.dtype | None:
    """The dtype config.json declares (`dtype`, or transformers 4's `torch_dtype`), if it is 16-bit."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    name = config.get("dtype") or config.get("torch_dtype")
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(name))


def restore_dtype(export_dir: Path, dtype: torch.dtype) -> int:
    """Casts the export's float32 non-scale tensors to `dtype` in place; returns how many."""
    from safetensors.torch import load_file, save_file

    changed = 0
    for path in sorted(Path(export_dir).glob("*.safetensors")):
        tensors = load_file(str(path))
        for name, tensor in tensors.items():
            if tensor.dtype == torch.float32 and not name.endswith(SCALE_SUFFIXES):
                tensors[name] = tensor.to(dtype)
                changed += 1
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(path)
    config_path = Path(export_dir) / "config.json"
    config = json.loads(config_path.read_text())
    name = str(dtype).removeprefix("torch.")
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = name
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return changed
