"""Export the trained draft with ModelOpt and normalise the result.

ModelOpt 0.47's `export_speculative_decoding` writes config.json (its LlamaForCausalLMEagle3
template) and model.safetensors (`fc`, `layers.0.*`, `norm`, `lm_head`, `d2t`); under 0.37, which has
no such export, `modelopt_compat.export_raw` yields the same from the module. We then (a) name the
decoder layer the way the TensorRT-LLM release loads it (`midlayer.*`: 1.1's Eagle3DraftModel does not remap `layers.0.*`;
contract: eagle3_draft.layer_prefix), (b) cast the float tensors to the export dtype (ModelOpt
casts only quantized models), (c) fill `transformers_version` and `torch_dtype`, (d) write RoPE as
top-level `rope_theta` / `rope_scaling` (what transformers 4.57 reads; `rope_scaling: null` for plain
RoPE) and (e) copy the target's tokenizer files so the draft's tokenizer identity can be checked.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtbuild.core.contract import load_contract
from trtbuild.core.contract.hf_config import legacy_rope_keys
from trtbuild.draft.modelopt_compat import export_raw

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja")
CONSUMERS = ("tensorrt_llm: speculative_config (decoding type and draft key per release: trtbuild/core/contract)",
             "modelopt: export_speculative_decoding layout (LlamaForCausalLMEagle3)",
             "trtbuild.runtime: load_draft")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tensorrt_llm_names(tensors: dict[str, Any], layer_prefix: str) -> dict[str, Any]:
    """Decoder-layer tensors under `layer_prefix` (`midlayer.`) instead of ModelOpt's `layers.0.`."""
    return {(layer_prefix + name[len("layers.0."):] if name.startswith("layers.0.") else name): t
            for name, t in tensors.items()}


def export_draft(model: nn.Module, out_dir: Path, *, target_dir: Path, dtype: str,
                 layer_prefix: str | None = None) -> dict[str, Any]:
    """Write the draft checkpoint into `out_dir` (created); returns facts for the manifest.

    `layer_prefix`: the decoder layer's tensor prefix the TensorRT-LLM release reads (default: the
    default release's contract)."""
    if layer_prefix is None:
        layer_prefix = load_contract().draft_layer_prefix
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=False)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as raw, torch.inference_mode():
        model.eval()
        tensors, config = export_raw(model, Path(raw))

    target_dtype = _DTYPES[dtype]
    tensors = {name: (t.to(target_dtype) if t.is_floating_point() else t.to(torch.int64)).contiguous()
               for name, t in tensorrt_llm_names(tensors, layer_prefix).items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = normalise_config(config, dtype)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    copied = [name for name in TOKENIZER_FILES if (Path(target_dir) / name).is_file()]
    for name in copied:
        shutil.copyfile(Path(target_dir) / name, out_dir / name)
    return {"tensors": sorted(tensors), "dtype": dtype, "tokenizer_files": copied,
            "consumers": list(CONSUMERS)}


def normalise_config(config: dict[str, Any], dtype: str) -> dict[str, Any]:
    import transformers

    config = legacy_rope_keys(dict(config))
    config["torch_dtype"] = dtype
    config["transformers_version"] = config.get("transformers_version") or transformers.__version__
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        theta = scaling.get("rope_theta")
        if config.get("rope_theta") is None and theta is not None:
            config["rope_theta"] = theta
        kind = scaling.get("rope_type") or scaling.get("type")
        if kind in (None, "default"):
            config["rope_scaling"] = None
        else:
            config["rope_scaling"] = {k: v for k, v in scaling.items() if k != "rope_theta"}
    return config
