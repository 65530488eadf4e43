"""Export the trained draft with ModelOpt (`export_speculative_decoding`) and normalise the result.

ModelOpt writes config.json (its LlamaForCausalLMEagle3 template) and model.safetensors
(`fc`, `layers.0.*`, `norm`, `lm_head`, `d2t`). We then (a) cast the float tensors to the export
dtype (ModelOpt casts only quantized models), (b) fill `transformers_version` and `torch_dtype`,
(c) write `rope_scaling: null` for plain RoPE (the classic Llama form every loader reads) and
(d) copy the target's tokenizer files so the draft's tokenizer identity can be checked later.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja")
CONSUMERS = ("tensorrt_llm: speculative_config.decoding_type Eagle3 (speculative_model_dir)",
             "modelopt: export_speculative_decoding layout (LlamaForCausalLMEagle3)",
             "trtbuild.runtime: load_draft")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def export_draft(model: nn.Module, out_dir: Path, *, target_dir: Path, dtype: str) -> dict[str, Any]:
    """Write the draft checkpoint into `out_dir` (created); returns facts for the manifest."""
    from modelopt.torch.export import export_speculative_decoding
    from safetensors.torch import load_file, save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=False)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as raw, torch.inference_mode():
        model.eval()
        export_speculative_decoding(model, export_dir=raw)
        tensors = load_file(str(Path(raw) / "model.safetensors"))
        config = json.loads((Path(raw) / "config.json").read_text())

    target_dtype = _DTYPES[dtype]
    tensors = {name: (t.to(target_dtype) if t.is_floating_point() else t.to(torch.int64)).contiguous()
               for name, t in tensors.items()}
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

    config = dict(config)
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
