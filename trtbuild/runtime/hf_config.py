"""Reads a Hugging Face Llama directory's config.json (and ModelOpt's hf_quant_config.json).

Only the Llama family is supported: the tiny target, Llama 3.x and Llama 4 text models
(`Llama4ForCausalLM`: MoE, shared expert, NoPE layers, chunked attention), also in the
`Llama4ForConditionalGeneration` form the engine bundle carries (config.text_config, weights under
`language_model.`) as long as it has no vision part (target.py refuses vision tensors). Anything else
is refused with a one-line `UserError` naming the architecture, before any weight is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError

LLAMA_ARCHITECTURES = ("LlamaForCausalLM",)
LLAMA4_ARCHITECTURES = ("Llama4ForCausalLM",)
LLAMA4_WRAPPED = "Llama4ForConditionalGeneration"
WRAPPED_PREFIX = "language_model."  # TensorRT-LLM strips it too (contract llama4_model.weight_prefix)
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3",)


@dataclass(frozen=True)
class QuantInfo:
    """What ModelOpt's unified export says about the checkpoint's quantization."""

    quant_algo: str | None = None  # "FP8", "NVFP4" or None
    kv_cache_quant_algo: str | None = None  # "FP8" or None
    exclude_modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Llama4Spec:
    """What a Llama 4 text decoder adds to a Llama one, per layer resolved as transformers'
    Llama4TextConfig derives it (moe_layers, no_rope_layers, layer_types)."""

    num_experts: int
    top_k: int
    intermediate_size_mlp: int  # dense layers' MLP width (LlamaSpec.intermediate_size: the experts')
    moe_layers: frozenset[int]
    use_rope: tuple[bool, ...]  # per layer; False: a NoPE layer
    chunked: tuple[bool, ...]  # per layer: attention within `attention_chunk_size` chunks
    attention_chunk_size: int | None
    use_qk_norm: bool  # L2-normalise q and k on RoPE layers
    attn_temperature_tuning: bool  # scale NoPE layers' queries with the position
    floor_scale: float
    attn_scale: float


@dataclass(frozen=True)
class LlamaSpec:
    """The shape of a Llama decoder stack (target or the EAGLE-3 draft's single layer)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    eos_token_ids: tuple[int, ...]
    llama4: Llama4Spec | None = None
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False, default_factory=dict)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError("no config.json in the model directory", file=str(path.parent),
                        fix="point at a Hugging Face model directory") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"not valid JSON ({exc.msg} at line {exc.lineno})", file=str(path)) from None
    if not isinstance(data, dict):
        raise UserError("config is not a JSON object", file=str(path))
    return data


def _eos_ids(cfg: dict[str, Any], model_dir: Path) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (cfg, _generation_config(model_dir)):
        value = source.get("eos_token_id")
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, list):
            ids.extend(v for v in value if isinstance(v, int))
    return tuple(dict.fromkeys(ids))


def _generation_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def spec_from_config(cfg: dict[str, Any], model_dir: Path, *, file: str) -> LlamaSpec:
    """Builds a `LlamaSpec`, refusing configs our runtime cannot execute faithfully."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"hidden_act {act!r} is not supported (Llama uses silu)", file=file,
                        field="hidden_act")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        spec = LlamaSpec(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg.get("num_hidden_layers", 1)),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            eos_token_ids=_eos_ids(cfg, model_dir),
            llama4=_llama4_spec(cfg, file) if _is_llama4(cfg) else None,
            raw=cfg,
        )
    except KeyError as exc:
        raise UserError(f"config.json lacks {exc.args[0]!r}", file=file, field=str(exc.args[0])) from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"config.json has a bad value ({exc})", file=file) from None
    if spec.num_heads % spec.num_kv_heads:
        raise UserError(f"num_attention_heads {spec.num_heads} is not a multiple of num_key_value_heads "
                        f"{spec.num_kv_heads}", file=file, field="num_key_value_heads")
    return spec


def _is_llama4(cfg: dict[str, Any]) -> bool:
    archs = cfg.get("architectures") or []
    return any(a in LLAMA4_ARCHITECTURES for a in archs) or (not archs and cfg.get("model_type") == "llama4_text")


def _llama4_spec(cfg: dict[str, Any], file: str) -> Llama4Spec:
    """The Llama 4 fields, defaulted exactly as transformers' Llama4TextConfig.__post_init__ does."""
    layers = int(cfg.get("num_hidden_layers", 1))
    step = int(cfg.get("interleave_moe_layer_step", 1))
    moe = cfg.get("moe_layers")
    moe_layers = list(moe) if moe is not None else list(range(step - 1, layers, step))
    interval = int(cfg.get("no_rope_layer_interval", 4))
    no_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    layer_types = cfg.get("layer_types") or ["chunked_attention" if r else "full_attention" for r in no_rope]
    if len(no_rope) < layers or len(layer_types) < layers:
        raise UserError(f"no_rope_layers / layer_types name fewer than {layers} layers", file=file,
                        field="no_rope_layers")
    unknown = sorted(set(layer_types[:layers]) - {"chunked_attention", "full_attention"})
    if unknown:
        raise UserError(f"layer_types {unknown} are not supported (chunked_attention, full_attention)",
                        file=file, field="layer_types")
    chunk = cfg.get("attention_chunk_size")
    chunked = tuple(t == "chunked_attention" for t in layer_types[:layers])
    if any(chunked) and not chunk:
        raise UserError("chunked_attention layers without attention_chunk_size", file=file,
                        field="attention_chunk_size")
    return Llama4Spec(
        num_experts=int(cfg.get("num_local_experts", 16)),
        top_k=int(cfg.get("num_experts_per_tok", 1)),
        intermediate_size_mlp=int(cfg.get("intermediate_size_mlp", 16384)),
        moe_layers=frozenset(int(i) for i in moe_layers),
        use_rope=tuple(bool(r) for r in no_rope[:layers]),
        chunked=chunked,
        attention_chunk_size=int(chunk) if chunk else None,
        use_qk_norm=bool(cfg.get("use_qk_norm", True)),
        attn_temperature_tuning=bool(cfg.get("attn_temperature_tuning", True)),
        floor_scale=float(cfg.get("floor_scale", 8192)),
        attn_scale=float(cfg.get("attn_scale", 0.1)),
    )


def read_target_config(model_dir: Path) -> tuple[LlamaSpec, QuantInfo]:
    """Config of a target directory: a Llama or Llama 4 text model, unquantized or ModelOpt FP8."""
    path = model_dir / "config.json"
    cfg = unwrap_llama4(read_json(path), str(path))
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    known = LLAMA_ARCHITECTURES + LLAMA4_ARCHITECTURES
    if not any(a in known for a in archs) and not (not archs and model_type in ("llama", "llama4_text")):
        name = ", ".join(archs) if archs else f"model_type {model_type!r}"
        raise UserError(f"architecture {name} is not supported by the trtbuild runtime "
                        "(LlamaForCausalLM and Llama4ForCausalLM only)",
                        file=str(path), field="architectures",
                        fix="use a LlamaForCausalLM or Llama4ForCausalLM (text) checkpoint, or serve this "
                        "model through TensorRT-LLM")
    return spec_from_config(cfg, model_dir, file=str(path)), read_quant_info(model_dir, cfg)


def unwrap_llama4(cfg: dict[str, Any], file: str) -> dict[str, Any]:
    """A text-only `Llama4ForConditionalGeneration` config as the `Llama4ForCausalLM` one it wraps
    (quantization_config kept); a vision_config is refused. Other configs: unchanged."""
    if LLAMA4_WRAPPED not in (cfg.get("architectures") or []):
        return cfg
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise UserError(f"{LLAMA4_WRAPPED} without a text_config object", file=file, field="text_config")
    if cfg.get("vision_config"):
        raise UserError(f"{LLAMA4_WRAPPED} with a vision_config is not supported by the trtbuild runtime "
                        "(text-only Llama 4)", file=file, field="vision_config",
                        fix="serve the multimodal model through TensorRT-LLM")
    out = {**text, "architectures": list(LLAMA4_ARCHITECTURES), "model_type": "llama4_text"}
    for key in ("quantization_config", "torch_dtype", "tie_word_embeddings"):
        if key in cfg and key not in text:
            out[key] = cfg[key]
    return out


def read_quant_info(model_dir: Path, cfg: dict[str, Any]) -> QuantInfo:
    """hf_quant_config.json first (as TRT-LLM does), then config.json's quantization_config."""
    path = model_dir / "hf_quant_config.json"
    if path.is_file():
        quant = read_json(path).get("quantization") or {}
    else:
        quant = cfg.get("quantization_config") or {}
    if not isinstance(quant, dict):
        quant = {}
    algo = quant.get("quant_algo")
    kv_algo = quant.get("kv_cache_quant_algo")
    if kv_algo is None and isinstance(quant.get("kv_cache_scheme"), dict):
        kv_algo = "FP8"  # compressed-tensors style mirror written into config.json by ModelOpt
    for name, value, known in (("quant_algo", algo, (None, "FP8", "NVFP4")), ("kv_cache_quant_algo", kv_algo, (None, "FP8"))):
        if value not in known:
            raise UserError(f"{name} {value!r} is not supported by the trtbuild runtime "
                            f"({' or '.join(k for k in known if k)} only)",
                            file=str(path if path.is_file() else model_dir / "config.json"), field=name)
    exclude = quant.get("exclude_modules") or quant.get("ignore") or []
    return QuantInfo(algo, kv_algo, tuple(str(x) for x in exclude))
