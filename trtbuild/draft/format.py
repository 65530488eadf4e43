"""The EAGLE-3 draft checkpoint format that TRT-LLM's loader reads (see shared/REFERENCE.md).

config.json: `architectures: ["LlamaForCausalLMEagle3"]`, the Llama keys of the draft's one
decoder layer, `draft_vocab_size`, and `eagle_config` (aux layer ids and layer-norm switches).
model.safetensors: `fc.weight` [hidden, n_aux * hidden], one decoder layer (`midlayer.*`, the name
TensorRT-LLM loads and trtbuild writes; ModelOpt's own export says `layers.0.*`, which only newer
TRT-LLM remaps: trtbuild/core/contract), `norm.weight`, optional `lm_head.weight` [draft_vocab, hidden]
and `d2t` (int [draft_vocab]; target_id = draft_id + d2t[draft_id]).

Reading here never imports torch: shapes and dtypes come from the safetensors headers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError
from trtbuild.core.safetensors_header import read_header

ARCHITECTURE = "LlamaForCausalLMEagle3"
# Other names published EAGLE-3 Llama drafts use for the same layout.
ARCHITECTURE_ALIASES = (ARCHITECTURE, "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle")

# Config keys our export writes (ModelOpt's llama EAGLE template); TRT-LLM reads these.
CONFIG_KEYS = (
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "num_hidden_layers", "hidden_act", "rms_norm_eps",
    "max_position_embeddings", "rope_theta", "rope_scaling", "attention_bias", "mlp_bias",
    "vocab_size", "draft_vocab_size", "tie_word_embeddings", "torch_dtype", "bos_token_id",
    "eos_token_id", "eagle_config",
)
EAGLE_CONFIG_KEYS = (
    "eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state", "use_input_layernorm_in_first_layer",
    "use_last_layernorm",
)

# The decoder layer's tensors, relative to its prefix (`midlayer.` or ModelOpt's `layers.0.`).
LAYER_TENSORS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
)
TOP_TENSORS = ("fc.weight", "norm.weight")
OPTIONAL_TENSORS = ("lm_head.weight", "d2t")
LAYER_PREFIXES = ("midlayer.", "layers.0.")

FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
INT_DTYPES = ("I64", "I32")


def default_aux_layers(num_layers: int) -> list[int]:
    """TRT-LLM's default capture layers {1, L/2-1, L-4}, clipped to [0, L) and de-duplicated."""
    wanted = (1, num_layers // 2 - 1, num_layers - 4)
    return sorted({min(max(i, 0), num_layers - 1) for i in wanted})


@dataclass
class TensorInfo:
    shape: list[int]
    dtype: str  # safetensors dtype code: F32, BF16, I64, ...


@dataclass
class DraftCheckpoint:
    """A draft directory read cheaply: config.json plus the tensor headers."""

    directory: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # tensor name -> safetensors file

    @property
    def eagle_config(self) -> dict[str, Any]:
        value = self.config.get("eagle_config")
        return value if isinstance(value, dict) else {}

    @property
    def layer_prefix(self) -> str | None:
        for prefix in LAYER_PREFIXES:
            if any(name.startswith(prefix) for name in self.tensors):
                return prefix
        return None

    def tensor(self, name: str) -> TensorInfo | None:
        return self.tensors.get(name)

    def layer_tensor(self, name: str) -> TensorInfo | None:
        prefix = self.layer_prefix
        return self.tensors.get(prefix + name) if prefix else None

    def aux_layer_ids(self) -> list[int] | None:
        ids = self.eagle_config.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            ids = self.config.get("eagle_aux_hidden_state_layer_ids")
        return list(ids) if isinstance(ids, list) else None

    def draft_vocab_size(self) -> int:
        value = self.config.get("draft_vocab_size")
        return int(value) if value is not None else int(self.config.get("vocab_size", 0))

    def load_tensor(self, name: str) -> Any:
        """One tensor as a torch tensor (imports torch; used for the small d2t table)."""
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as handle:
            return handle.get_tensor(name)


def read_draft(directory: Path, where: str = "draft.path") -> DraftCheckpoint:
    """Read config.json and every *.safetensors header of a draft directory."""
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise UserError(f"{directory} has no config.json; not an EAGLE-3 draft directory", field=where,
                        fix="point at a directory with config.json and model.safetensors")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"invalid JSON: {exc.msg}", file=str(config_file), line=exc.lineno) from None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UserError(f"{directory} has no *.safetensors weights", field=where,
                        fix="EAGLE-3 drafts are loaded from safetensors only")
    checkpoint = DraftCheckpoint(directory=directory, config=config)
    for file in files:
        for name, info in read_header(file).items():
            checkpoint.tensors[name] = TensorInfo(shape=list(info["shape"]), dtype=str(info["dtype"]))
            checkpoint.files[name] = file
    return checkpoint
