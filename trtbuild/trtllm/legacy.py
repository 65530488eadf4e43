"""The legacy TensorRT-engine path (`backend: tensorrt`): checkpoint conversion and `trtllm-build`.

For users pinned to a TRT-LLM release that still ships the engine builder. Two steps:
1. a TRT-LLM checkpoint (config.json + rank<N>.safetensors): the quantize stage's
   `trtllm_checkpoint` export when FP8, else `convert_checkpoint.py` from the release's examples;
2. `trtllm-build` with the plugin flags of tensorrt_llm/plugin/plugin.py (values
   auto/float16/bfloat16/fp8/disable, features enable/disable).
Engines are specific to the GPU they are built on, so the bundle carries the commands (and a
script running them) rather than an engine, unless `tensorrt_llm` and a GPU are present.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

# model_type -> the examples directory whose convert_checkpoint.py handles it (TRT-LLM >= 0.17 layout).
CONVERTERS = {
    "llama": "models/core/llama",
    "mistral": "models/core/llama",
    "mixtral": "models/core/llama",
    "qwen2": "models/core/qwen",
    "qwen2_moe": "models/core/qwen",
    "gemma": "models/core/gemma",
}


@dataclass(frozen=True)
class LegacySpec:
    model_type: str
    dtype: str  # "bfloat16" | "float16"
    fp8: bool
    checkpoint_ready: bool  # True: the quantize stage wrote a TRT-LLM checkpoint already
    tensor_parallel: int
    pipeline_parallel: int
    expert_parallel: int
    moe: bool
    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int
    tokens_per_block: int = 32
    hf_dir: str = "hf"  # relative to the bundle root
    checkpoint_dir: str = "target"
    engine_dir: str = "engine"
    plugin_flags: dict[str, str] = field(default_factory=dict)  # from the bundle's plugins
    extra_flags: tuple[str, ...] = ()


def convert_argv(spec: LegacySpec) -> list[str] | None:
    """convert_checkpoint.py command, or None when the checkpoint already exists."""
    if spec.checkpoint_ready:
        return None
    example = CONVERTERS[spec.model_type]
    argv = ["python3", "${TRTLLM_EXAMPLES:-/app/tensorrt_llm/examples}/" + example + "/convert_checkpoint.py",
            "--model_dir", spec.hf_dir, "--output_dir", spec.checkpoint_dir, "--dtype", spec.dtype,
            "--tp_size", str(spec.tensor_parallel), "--pp_size", str(spec.pipeline_parallel)]
    if spec.moe:
        argv += ["--moe_tp_size", str(spec.tensor_parallel // spec.expert_parallel),
                 "--moe_ep_size", str(spec.expert_parallel)]
    return argv


def build_flags(spec: LegacySpec) -> dict[str, str]:
    """The plugin and feature flags, before the bundle's plugins add theirs."""
    flags = {
        "--gpt_attention_plugin": "auto",
        # FP8 GEMMs go through the FP8 cuBLASLt plugin; the checkpoint's scales calibrate it.
        "--gemm_plugin": "fp8" if spec.fp8 else "auto",
        "--context_fmha": "enable",
        "--use_paged_context_fmha": "enable",
        "--remove_input_padding": "enable",
        "--tokens_per_block": str(spec.tokens_per_block),
    }
    if spec.fp8:
        flags["--use_fp8_context_fmha"] = "enable"
    if spec.moe:
        flags["--moe_plugin"] = "auto"
    if spec.tensor_parallel * spec.pipeline_parallel == 1:
        flags["--nccl_plugin"] = "disable"
    flags.update(spec.plugin_flags)
    return flags


def build_argv(spec: LegacySpec) -> list[str]:
    argv = ["trtllm-build", "--checkpoint_dir", spec.checkpoint_dir, "--output_dir", spec.engine_dir,
            "--max_batch_size", str(spec.max_batch_size), "--max_seq_len", str(spec.max_seq_len),
            "--max_num_tokens", str(spec.max_num_tokens), "--kv_cache_type", "paged",
            "--workers", str(spec.tensor_parallel * spec.pipeline_parallel)]
    for flag, value in build_flags(spec).items():
        argv += [flag, value] if value else [flag]
    return argv + list(spec.extra_flags)


def build_script(spec: LegacySpec, recipe_name: str = "") -> str:
    """A script that converts (if needed) and builds the engine in place, from the bundle root."""
    recipe = f" for recipe '{recipe_name}'" if recipe_name else ""
    lines = ["#!/usr/bin/env bash",
             f"# Written by trtbuild{recipe}: builds the TensorRT engine on the GPU it will serve on.",
             "# Needs a TensorRT-LLM release with the engine builder (trtllm-build); set TRTLLM_EXAMPLES",
             "# to its examples/ directory if it is not /app/tensorrt_llm/examples.",
             "set -euo pipefail", 'cd "$(dirname "${BASH_SOURCE[0]}")/.."']
    convert = convert_argv(spec)
    if convert is not None:
        lines.append(_line(convert))
    lines.append(_line(build_argv(spec)))
    return "\n".join(lines) + "\n"


def _line(argv: list[str]) -> str:
    parts = [f'"{a}"' if "${" in a else shlex.quote(a) for a in argv]
    return " \\\n  ".join(_pairs(parts))


def _pairs(parts: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(parts):
        if parts[i].startswith("--") and i + 1 < len(parts) and not parts[i + 1].startswith("--"):
            out.append(f"{parts[i]} {parts[i + 1]}")
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return out
