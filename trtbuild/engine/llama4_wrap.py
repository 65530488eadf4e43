"""Write a text-only Llama 4 target in the form TensorRT-LLM's PyTorch backend loads.

Every contracted release registers Llama 4 only as `Llama4ForConditionalGeneration` (contract
`llama4_model`): it swaps in `config.text_config` and strips the `language_model.` prefix from
weight names. A `Llama4ForCausalLM` export (what `model.tiny.llama4` trains) is therefore rewritten
in the bundle: config.json wraps the text config, tensors `model.*` / `lm_head.*` are renamed
`language_model.model.*` / `language_model.lm_head.*` (a model.safetensors.index.json lists them);
the FP8 exclude lists keep the unprefixed module names the release matches them against. No vision
config or weights are added (the contract records what each release does without them).

Only the safetensors headers change; tensor bytes are streamed unchanged. Every rewritten file
replaces the hard link atomically, so the input artifact stays untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtbuild.core.safetensors_header import read_header

TEXT_ARCHITECTURE = "Llama4ForCausalLM"
PREFIX = "language_model."  # what Llama4HfWeightMapper / load_weights strip (contract llama4_model)
# Top-level keys of a wrapped config (transformers' Llama4Config) that stay beside text_config.
_WRAPPER_KEYS = ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings", "transformers_version")


def text_only_env(contract: Any) -> dict[str, str]:
    """The server environment a wrapped (text-only) target needs at the release (contract
    llama4_model.text_only_load_needs.env: TLLM_MULTIMODAL_DISAGGREGATED=1, read when modeling_llama is
    imported; without it Llama4ForConditionalGeneration builds a vision encoder and, finding no vision
    tensors, loads it with transformers' load_sharded_checkpoint from the whole checkpoint)."""
    needs = (contract.section("llama4_model") or {}).get("text_only_load_needs") or {}
    return {str(k): str(v) for k, v in (needs.get("env") or {}).items()}


def is_text_llama4(config: Mapping[str, Any]) -> bool:
    archs = config.get("architectures") or []
    return TEXT_ARCHITECTURE in archs or (not archs and config.get("model_type") == "llama4_text")


def wrapped_name(name: str, prefix: str) -> str:
    """`model.x` / `lm_head.x` -> `<prefix>model.x` / `<prefix>lm_head.x`; anything else unchanged."""
    if name.startswith(("model.", "lm_head")):
        return prefix + name
    return name


def wrapped_config(text: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    inner = {k: v for k, v in text.items() if k not in ("architectures", "quantization_config")}
    inner["model_type"] = "llama4_text"
    outer: dict[str, Any] = {"architectures": [architecture], "model_type": "llama4"}
    outer.update({k: text[k] for k in _WRAPPER_KEYS if k in text})
    outer["text_config"] = inner
    return outer


def rename_safetensors(path: Path, prefix: str) -> None:
    """Rewrite `path`'s header with wrapped tensor names; the data section is copied byte for byte."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with path.open("rb") as src:
        (length,) = struct.unpack("<Q", src.read(8))
        header = json.loads(src.read(length))
        renamed = {k if k == "__metadata__" else wrapped_name(k, prefix): v for k, v in header.items()}
        raw = json.dumps(renamed, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
        with tmp.open("wb") as dst:
            dst.write(struct.pack("<Q", len(raw)))
            dst.write(raw)
            shutil.copyfileobj(src, dst, 1 << 24)
    os.replace(tmp, path)


def _replace_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def wrap_target(directory: Path, architecture: str, prefix: str = PREFIX) -> list[str]:
    """Rewrite a text-only Llama 4 directory in place as `architecture`; returns the files rewritten
    ([] when it is not a text-only Llama 4)."""
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    if not is_text_llama4(config):
        return []
    written = ["config.json"]
    _replace_json(config_file, wrapped_config(config, architecture))
    for file in sorted(directory.glob("*.safetensors")):
        rename_safetensors(file, prefix)
        written.append(file.name)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {wrapped_name(k, prefix): v for k, v in data.get("weight_map", {}).items()}
    else:  # releases that fall back to load_sharded_checkpoint for vision need an index (contract)
        data = {"metadata": {}, "weight_map": {name: file.name for file in sorted(directory.glob("*.safetensors"))
                                               for name in read_header(file)}}
    _replace_json(index, data)
    written.append(index.name)
    # hf_quant_config.json's exclude_modules stay as they are: the release matches them against its own
    # module names (model.layers.*, lm_head), which carry no prefix (contract: exclude_modules_match).
    return written
