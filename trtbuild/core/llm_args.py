"""A typed model of the TensorRT-LLM `LLM()` arguments trtbuild writes into llm_api_options.yaml.

`trtllm-serve --extra_llm_api_options FILE` (1.1; later releases also `--config`) merges the YAML's
keys into the `LLM()` keyword arguments, so every key here must be a real argument name. This model
is trtbuild's own typed view (types, ranges, unknown keys); what a given release accepts (its field
names, enums, decoding types, cross-field rules) is the versioned contract in trtbuild/core/contract/,
which checks every file built from this model.

Only the subset trtbuild sets or lets a recipe pass through is modelled. The file holds only
the fields that were set (`exclude_unset`), so an unset field keeps TRT-LLM's own default, and
`null` stays meaningful (e.g. `cuda_graph_config: null` turns CUDA graphs off).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtbuild.core.errors import UserError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class KvCacheConfig(_Strict):
    """`kv_cache_config`."""

    enable_block_reuse: bool = Field(default=True, description="Reuse KV blocks across requests "
                                     "sharing a prefix.")
    free_gpu_memory_fraction: float | None = Field(default=0.9, ge=0.0, le=1.0, description="Share of "
                                                   "free GPU memory given to the KV cache after weights.")
    max_tokens: int | None = Field(default=None, ge=1, description="Cap on KV cache tokens.")
    dtype: str = Field(default="auto", description="KV cache dtype: auto, fp8, bfloat16, float16 "
                       "(PyTorch backend).")
    tokens_per_block: int = Field(default=32, ge=1, description="Tokens per paged KV block.")


class CudaGraphConfig(_Strict):
    """`cuda_graph_config`: decode-only CUDA graphs for these batch sizes."""

    batch_sizes: list[int] | None = Field(default=None, description="Batch sizes to capture.")
    max_batch_size: int = Field(default=0, ge=0, description="Capture sizes up to this "
                                "(0: from batch_sizes).")
    enable_padding: bool = Field(default=False, description="Round batches up to a captured size.")

    @model_validator(mode="after")
    def _positive(self) -> CudaGraphConfig:
        # Whether both may be given differs by release: the contract checks that.
        if self.batch_sizes is not None and any(b < 1 for b in self.batch_sizes):
            raise ValueError("cuda_graph_config.batch_sizes must be positive")
        return self


class SpeculativeConfig(BaseModel):
    """`speculative_config`. Generic over decoding types: the release's contract decides which
    `decoding_type` names and fields exist (EAGLE-3 is `Eagle` in 1.1, `Eagle3` later; the draft
    path is `speculative_model_dir` in 1.1, `speculative_model` later)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    # Required (no default): TRT-LLM picks the decoding config class by this key.
    decoding_type: str = Field(description="Decoding type name of the release (contract: speculative).")
    max_draft_len: int = Field(ge=1, description="Draft tokens proposed per step.")
    speculative_model_dir: str | None = Field(default=None, description="Draft checkpoint directory (1.1 "
                                              "name; relative paths resolve against the server's working dir).")
    speculative_model: str | None = Field(default=None, description="Draft checkpoint (name after 1.1).")
    eagle3_one_model: bool | None = Field(default=None, description="Run the draft inside the target's "
                                          "engine (faster) instead of as a second model.")
    eagle3_layers_to_capture: list[int] | None = Field(default=None, description="Target layers whose "
                                                       "hidden states feed the draft; TRT-LLM's default "
                                                       "is {1, L/2-1, L-4}.")
    max_total_draft_tokens: int | None = Field(default=None, ge=1, description="Tree drafting: draft "
                                               "tokens per step over all branches.")
    greedy_sampling: bool | None = Field(default=None, description="Top-1 acceptance (token equality).")
    # NGram (prompt lookup, no draft model): the fields each release accepts, and which it requires, are
    # in its contract (speculative.decoding_types.NGram, with the upstream source); conformance checks
    # the written file against it. max_matching_ngram_size is required there, so trtbuild always writes it.
    max_matching_ngram_size: int | None = Field(default=None, ge=1, description="NGram: longest suffix "
                                                "of the context looked up.")
    is_keep_all: bool | None = Field(default=None, description="NGram: keep every continuation of a "
                                     "pattern (TRT-LLM default true).")
    is_use_oldest: bool | None = Field(default=None, description="NGram: propose the oldest match of a "
                                       "pattern (TRT-LLM default true); false: the newest.")
    is_public_pool: bool | None = Field(default=None, description="NGram: one pattern pool shared by all "
                                        "requests (TRT-LLM default true); false: one per request, as "
                                        "trtbuild's runtime rehearses it.")

    @property
    def draft_path(self) -> str | None:
        return self.speculative_model or self.speculative_model_dir

    def with_draft_path(self, path: str) -> SpeculativeConfig:
        key = "speculative_model" if self.speculative_model is not None else "speculative_model_dir"
        return self.model_copy(update={key: path})


# The EAGLE-3 case of the generic model (older imports).
Eagle3DecodingConfig = SpeculativeConfig


class MoeConfig(_Strict):
    """`moe_config` (PyTorch backend)."""

    backend: str | None = Field(default=None, description="MoE kernel backend; the release's contract "
                                "lists the names (a Literal upstream).")
    max_num_tokens: int | None = Field(default=None, ge=1, description="Chunk size of MoE tokens.")


class LlmApiOptions(_Strict):
    """The `LLM()` arguments of one deployment (PyTorch backend unless noted)."""

    model: str | None = Field(default=None, description="Target checkpoint (trtllm-serve takes it "
                              "positionally; set here for the Triton LLM-API model.yaml).")
    tokenizer: str | None = Field(default=None, description="Tokenizer directory.")
    dtype: str | None = Field(default=None, description="Model dtype (auto, bfloat16, float16).")
    trust_remote_code: bool | None = Field(default=None, description="Allow custom model code.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="Tensor parallel size.")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="Pipeline parallel size.")
    moe_expert_parallel_size: int | None = Field(default=None, ge=1, description="Expert parallel size.")
    moe_tensor_parallel_size: int | None = Field(default=None, ge=1, description="Tensor parallel size "
                                                 "inside each expert.")
    gpus_per_node: int | None = Field(default=None, ge=1, description="GPUs per node.")
    enable_attention_dp: bool | None = Field(default=None, description="Data-parallel attention.")
    max_batch_size: int | None = Field(default=None, ge=1, description="Most requests in flight.")
    max_num_tokens: int | None = Field(default=None, ge=1, description="Most tokens in one forward pass.")
    max_seq_len: int | None = Field(default=None, ge=1, description="Prompt + output length limit.")
    max_input_len: int | None = Field(default=None, ge=1, description="Prompt length limit.")
    max_beam_width: int | None = Field(default=None, ge=1, description="Beam search width.")
    kv_cache_config: KvCacheConfig | None = Field(default=None, description="KV cache options.")
    cuda_graph_config: CudaGraphConfig | None = Field(default=None, description="CUDA graphs; null: off.")
    speculative_config: SpeculativeConfig | None = Field(default=None, description="Speculative decoding.")
    moe_config: MoeConfig | None = Field(default=None, description="MoE options.")
    enable_chunked_prefill: bool | None = Field(default=None, description="Split long prefills.")
    enable_min_latency: bool | None = Field(default=None, description="Min-latency mode (Llama 4).")
    enable_autotuner: bool | None = Field(default=None, description="Kernel autotuning at start-up.")
    disable_overlap_scheduler: bool | None = Field(default=None, description="Turn the overlap "
                                                   "scheduler off.")
    attn_backend: str | None = Field(default=None, description="Attention backend (TRTLLM, FLASHINFER).")
    print_iter_log: bool | None = Field(default=None, description="Log every iteration.")
    stream_interval: int | None = Field(default=None, ge=1, description="Iterations per streamed chunk.")

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that were set, nested too, as plain YAML-able values."""
        return self.model_dump(mode="json", exclude_unset=True)


def parse_options(data: Any, where: str) -> LlmApiOptions:
    """Validate a mapping of `LLM()` arguments; errors are one line naming the key."""
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping of LLM() arguments, got {type(data).__name__}", file=where)
    try:
        return LlmApiOptions.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise UserError(f"'{key}' is not a TensorRT-LLM LLM() argument trtbuild knows", file=where,
                            field=key, fix="check the name against tensorrt_llm/llmapi/llm_args.py") from None
        raise UserError(err["msg"], file=where, field=key, fix="give a valid value") from None


def dump_yaml(options: LlmApiOptions) -> str:
    import yaml

    header = "# TensorRT-LLM LLM() arguments (trtllm-serve --extra_llm_api_options); written by trtbuild\n"
    return header + yaml.safe_dump(options.to_dict(), sort_keys=False, default_flow_style=False)


def write_options(options: LlmApiOptions, path: Path) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(dump_yaml(options))
    os.replace(tmp, path)


def read_options(path: Path) -> LlmApiOptions:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"not valid YAML: {exc}".splitlines()[0], file=str(path)) from None
    return parse_options(data or {}, str(path))
