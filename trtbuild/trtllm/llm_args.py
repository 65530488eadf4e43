"""A typed model of the TensorRT-LLM `LLM()` arguments trtbuild writes into llm_api_options.yaml.

`trtllm-serve --config FILE` (alias `--extra_llm_api_options`) merges the YAML's keys into the
`LLM()` keyword arguments, so every key here must be a real argument name. Names and nesting
follow tensorrt_llm/llmapi/llm_args.py (BaseLlmArgs, TorchLlmArgs, KvCacheConfig,
CudaGraphConfig, EagleDecodingConfig / Eagle3DecodingConfig, MoeConfig); TRT-LLM's own models
are strict too, so a misspelt key would fail at server start, hours into a deployment.

Only the subset trtbuild sets or lets a recipe pass through is modelled. The file holds only
the fields that were set (`exclude_unset`), so an unset field keeps TRT-LLM's own default, and
`null` stays meaningful (e.g. `cuda_graph_config: null` turns CUDA graphs off).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtbuild.errors import UserError


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
    def _consistent(self) -> CudaGraphConfig:
        # TRT-LLM rejects both given unless max_batch_size == max(batch_sizes).
        if self.batch_sizes and self.max_batch_size and self.max_batch_size != max(self.batch_sizes):
            raise ValueError(f"cuda_graph_config.max_batch_size {self.max_batch_size} must equal "
                             f"max(batch_sizes) {max(self.batch_sizes)} when both are given")
        if self.batch_sizes is not None and any(b < 1 for b in self.batch_sizes):
            raise ValueError("cuda_graph_config.batch_sizes must be positive")
        return self


class Eagle3DecodingConfig(_Strict):
    """`speculative_config` for EAGLE-3 (TRT-LLM's Eagle3DecodingConfig; older releases: Eagle)."""

    # Required (no default): TRT-LLM picks the decoding config class by this key, so it must be in the file.
    decoding_type: Literal["Eagle3", "Eagle"] = Field(description="Eagle3 in TRT-LLM >= 1.1; older "
                                                      "releases spell EAGLE-3 as Eagle.")
    max_draft_len: int = Field(ge=1, description="Draft tokens proposed per step.")
    speculative_model_dir: str = Field(description="The EAGLE-3 draft checkpoint directory "
                                       "(relative paths resolve against the server's working dir).")
    eagle3_one_model: bool = Field(default=True, description="Run the draft inside the target's "
                                   "engine (faster) instead of as a second model.")
    eagle3_layers_to_capture: list[int] | None = Field(default=None, description="Target layers whose "
                                                       "hidden states feed the draft; TRT-LLM's default "
                                                       "is {1, L/2-1, L-4}.")
    max_total_draft_tokens: int | None = Field(default=None, ge=1, description="Tree drafting: draft "
                                               "tokens per step over all branches.")
    greedy_sampling: bool | None = Field(default=None, description="Top-1 acceptance (token equality).")


class NGramDecodingConfig(_Strict):
    """`speculative_config` for prompt lookup (TRT-LLM's NGramDecodingConfig, PyTorch backend only): no
    draft model; the drafter proposes the tokens that followed the longest matching n-gram.

    Fields as in tensorrt_llm/llmapi/llm_args.py of the 1.1 line (DecodingBaseConfig.from_dict
    dispatches on decoding_type "NGram"; defaults there: max_matching_ngram_size 0 in 1.1, 2 later,
    so trtbuild always writes it); the pool semantics in tensorrt_llm/_torch/speculative/ngram.py.
    """

    decoding_type: Literal["NGram"] = Field(description="Selects TRT-LLM's n-gram drafter.")
    max_draft_len: int = Field(ge=1, description="Draft tokens proposed per step (at most).")
    max_matching_ngram_size: int = Field(ge=1, description="Longest suffix of the context looked up.")
    is_keep_all: bool | None = Field(default=None, description="Keep every continuation of a pattern "
                                     "(TRT-LLM default true).")
    is_use_oldest: bool | None = Field(default=None, description="Propose the oldest match of a pattern "
                                       "(TRT-LLM default true); false: the newest.")
    is_public_pool: bool | None = Field(default=None, description="One pattern pool shared by all "
                                        "requests (TRT-LLM default true); false: one per request, as "
                                        "trtbuild's runtime rehearses it.")
    max_total_draft_tokens: int | None = Field(default=None, ge=1, description="TRT-LLM sets it to "
                                               "max_draft_len (n-gram drafts are a chain).")


class MoeConfig(_Strict):
    """`moe_config` (PyTorch backend)."""

    backend: str | None = Field(default=None, description="MoE kernel backend: CUTLASS, TRTLLM, ...")
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
    speculative_config: Eagle3DecodingConfig | NGramDecodingConfig | None = Field(
        default=None, discriminator="decoding_type",
        description="Speculative decoding: an EAGLE-3 draft, or n-gram prompt lookup.")
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

    header = "# TensorRT-LLM LLM() arguments (trtllm-serve --config); written by trtbuild\n"
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
