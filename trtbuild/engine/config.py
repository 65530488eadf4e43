"""The engine stage's recipe section (`engine:`): what the TensorRT-LLM bundle is written for."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from trtbuild.core.contract import available_versions
from trtbuild.core.llm_args import LlmApiOptions
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.shell import has_control
from trtbuild.core.stage_api import StageConfig
from trtbuild.draft.config import DraftConfig

Linear = Literal["attention", "dense"]


class KvCacheSettings(StageConfig):
    free_gpu_memory_fraction: float = Field(default=0.9, gt=0.0, le=1.0, description="Share of the GPU "
                                            "memory left after weights that the KV cache takes "
                                            "(kv_cache_config.free_gpu_memory_fraction).")
    enable_block_reuse: bool = Field(default=True, description="Reuse KV blocks of shared prefixes "
                                     "(kv_cache_config.enable_block_reuse).")
    dtype: Literal["auto", "fp8", "bfloat16", "float16"] = Field(
        default="auto", description="KV cache dtype; auto follows the checkpoint (FP8 when the quantize "
        "stage calibrated FP8 KV scales).")
    tokens_per_block: int = Field(default=32, ge=1, le=1 << 16, description="Tokens per paged KV block.")


_SLURM_WORD = r"^[A-Za-z0-9][A-Za-z0-9._,+-]*$"  # anchored: pydantic patterns search
_SLURM_TIME = r"^([0-9]+-)?[0-9]+(:[0-9]{1,2}){0,2}$"  # ASCII digits: \d also takes ٤ or ４


class SlurmSettings(StageConfig):
    partition: str | None = Field(default=None, pattern=_SLURM_WORD, max_length=128, description="#SBATCH -p.")
    account: str | None = Field(default=None, pattern=_SLURM_WORD, max_length=128, description="#SBATCH -A.")
    time_limit: str = Field(default="01:00:00", pattern=_SLURM_TIME, description="#SBATCH -t "
                            "([D-]HH:MM:SS).")
    job_name: str = Field(default="trtllm-serve", pattern=_SLURM_WORD, max_length=128, description="#SBATCH -J.")


class LauncherSettings(StageConfig):
    nodes: int = Field(default=1, ge=1, le=4096, description="Nodes the deployment spans; > 1 uses mpirun or Slurm.")
    gpus_per_node: int = Field(default=8, ge=1, le=64, description="GPUs per node (one MPI rank each).")
    host: str = Field(default="localhost", description="Address trtllm-serve binds (TRTBUILD_HOST "
                      "overrides at launch).")
    port: int = Field(default=8000, ge=1, le=65535, description="Port of trtllm-serve (TRTBUILD_PORT "
                      "overrides at launch).")
    slurm: SlurmSettings = Field(default_factory=SlurmSettings, description="sbatch settings.")
    container_image: str | None = Field(default=None, description="Container with TensorRT-LLM for srun "
                                        "--container-image (pyxis): nvcr.io/nvidia/tensorrt-llm/release.")
    container_mounts: list[str] = Field(default_factory=list, description="Extra SRC:DST mounts for the "
                                        "container (the bundle itself is always mounted).")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        import re

        if not re.fullmatch(r"[A-Za-z0-9.:_\[\]-]{1,253}", value):
            raise ValueError(f"{value!r} is not a host name or address")
        return value

    @field_validator("container_image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and (not value or has_control(value) or any(c.isspace() for c in value)):
            raise ValueError(f"{value!r} must be an image reference without whitespace or control characters")
        return value

    @field_validator("container_mounts")
    @classmethod
    def _mounts(cls, mounts: list[str]) -> list[str]:
        for mount in mounts:
            if has_control(mount) or "," in mount or mount.count(":") not in (1, 2) or mount.startswith(":"):
                raise ValueError(f"{mount!r} is not a SRC:DST[:FLAGS] mount (no ',' or control characters)")
        return mounts


class GemmPluginSettings(StageConfig):
    kernels: dict[str, str] = Field(description="GPU arch -> the plugin its FP8 linears run at decode, e.g. "
                                    "{sm_90a: spatial_partition, sm_100a: spatial_partition}; "
                                    "gemm_weight_shuffle where warp specialization is unavailable (sm_89, "
                                    "sm_120a). Archs not listed keep TensorRT-LLM's GEMM.")
    linears: list[Linear] = Field(
        default_factory=lambda: list[Linear](["attention", "dense"]), description="FP8 per-tensor linears that use it: "
        "attention (fused qkv, o_proj) and dense (fused gate_up, down_proj, shared experts); MoE experts "
        "always keep TensorRT-LLM's kernels.")
    max_tokens: int = Field(default=16, ge=1, le=16, description="Largest token count of a call that runs "
                            "the plugin (decode and speculative verification); with one_copy false, more "
                            "tokens (prefill) run TensorRT-LLM's FP8 GEMM.")
    one_copy: bool = Field(default=True, description="The plugin owns each selected linear's weight in its "
                           "tile layout: TensorRT-LLM's copy is released after loading and the plugin's kernel "
                           "also runs prefill (on 1.1 / 1.2; releases with NCCL-window GEMM outputs keep both). "
                           "false keeps both copies (the selected weights' size again per GPU, taken from the "
                           "KV cache) and prefill on TensorRT-LLM's GEMM.")

    @field_validator("kernels")
    @classmethod
    def _some_kernel(cls, kernels: dict[str, str]) -> dict[str, str]:
        if not kernels:
            raise ValueError("name a kernel for at least one GPU arch, or remove gemm_plugin")
        return kernels

    @field_validator("linears")
    @classmethod
    def _some_linears(cls, linears: list[str]) -> list[str]:
        if not linears or len(set(linears)) != len(linears):
            raise ValueError("list attention and/or dense, each once")
        return linears


class EngineConfig(StageConfig):
    trtllm_version: str = Field(
        default="1.2.1", description="TensorRT-LLM release the bundle is written for (a contract in "
        "trtbuild/core/contract/: option names, decoding type, launcher flags and how the GEMM-plugin module is "
        "loaded, draft tensor names, Triton request fields). Default: the release in the Triton image "
        "deploy.trtllm.image names (tritonserver:26.07-trtllm-python-py3 ships 1.2.1; 25.12 to 26.02 ship 1.1.0).")
    backend: str = Field(default="pytorch", description="pytorch: TensorRT-LLM's LLM-API path, which loads "
                         "the HF checkpoint directly (the only backend; the TensorRT-engine one was removed).")
    max_batch_size: int = Field(default=8, ge=1, le=1 << 16, description="Most requests in flight (max_batch_size).")
    max_seq_len: int | None = Field(default=None, ge=1, le=1 << 24, description="Prompt + output tokens per request; "
                                    "default: the model's max_position_embeddings.")
    max_num_tokens: int = Field(default=8192, ge=1, le=1 << 24, description="Most tokens in one forward pass "
                                "(max_num_tokens); with speculation each request needs 1 + draft_len.")
    tensor_parallel: int = Field(default=1, ge=1, le=1024, description="Tensor parallel size (tensor_parallel_size).")
    pipeline_parallel: int = Field(default=1, ge=1, le=1024, description="Pipeline parallel size.")
    expert_parallel: int = Field(default=1, ge=1, le=1024, description="Expert parallel size of MoE layers "
                                 "(moe_expert_parallel_size); must divide tensor_parallel.")
    enable_attention_dp: bool = Field(default=False, description="Data-parallel attention across the "
                                      "tensor-parallel ranks (MoE throughput setups).")
    enable_min_latency: bool = Field(default=False, description="TRT-LLM's min-latency mode (Llama 4).")
    enable_autotuner: bool = Field(default=True, description="Autotune kernels at server start.")
    cuda_graphs: bool | list[int] = Field(
        default=True, description="true: CUDA graphs for batch sizes up to max_batch_size; a list: exactly "
        "those batch sizes; false: off (cuda_graph_config: null).")
    cuda_graph_padding: bool = Field(default=False, description="Pad batches up to a captured size.")
    kv_cache: KvCacheSettings = Field(default_factory=KvCacheSettings, description="KV cache options.")
    draft_len: int | None = Field(default=None, ge=1, le=16, description="Draft tokens per step at serve time "
                                  "(speculative_config.max_draft_len); default: draft.max_draft_len.")
    eagle3_one_model: bool = Field(default=True, description="Run the EAGLE-3 draft inside the target's "
                                   "executor (faster) rather than as a second model.")
    gemm_plugin: GemmPluginSettings | None = Field(
        default=None, description="trtbuild's FP8 GEMM plugins in the served model: a module the bundle "
        "ships and TensorRT-LLM's server imports routes decode-sized FP8 linears to the named kernel.")
    require_tensorrt_llm: bool = Field(default=False, description="Fail when tensorrt_llm is not importable "
                                       "instead of writing the bundle without the build / load check.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the server process, "
                                "e.g. {TRTLLM_ENABLE_PDL: '1'}. `${env:NAME}` values stay references, resolved "
                                "by the launch scripts at launch: secrets such as HF_TOKEN are never written.")
    llm_api_options: dict[str, Any] = Field(default_factory=dict, description="Further LLM() arguments "
                                            "merged into llm_api_options.yaml (checked against the typed "
                                            "model: unknown keys are errors).")
    launcher: LauncherSettings = Field(default_factory=LauncherSettings, description="Launch scripts.")

    @field_validator("backend")
    @classmethod
    def _pytorch_only(cls, backend: str) -> str:
        if backend != "pytorch":
            raise ValueError(f"'{backend}' is not served: trtbuild builds for TensorRT-LLM's PyTorch backend "
                             "only (upstream removed the TensorRT-engine backend, docs/source/legacy/"
                             "tensorrt-backend-removal.md); remove engine.backend or set it to pytorch")
        return backend

    @field_validator("trtllm_version", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("trtllm_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value not in available_versions():
            raise ValueError(f"no TensorRT-LLM contract for {value!r}; known: {', '.join(available_versions())}")
        return value

    @field_validator("cuda_graphs")
    @classmethod
    def _graph_sizes(cls, value: bool | list[int]) -> bool | list[int]:
        if isinstance(value, list) and (not value or any(b < 1 for b in value)):
            raise ValueError("cuda_graphs: give true, false or a non-empty list of positive batch sizes")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        import re

        bad = [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"'{bad[0]}' is not an environment variable name")
        bad = [k for k, v in env.items() if has_control(v)]
        if bad:
            raise ValueError(f"the value of {bad[0]} holds a control character (a newline?)")
        return env

    @field_validator("llm_api_options")
    @classmethod
    def _options_known(cls, options: dict[str, Any]) -> dict[str, Any]:
        import difflib

        known = sorted(LlmApiOptions.model_fields)
        unknown = sorted(set(options) - set(known))
        if unknown:
            guess = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f"did you mean '{guess[0]}'?" if guess else f"known: {', '.join(known)}"
            raise ValueError(f"'{unknown[0]}' is not an LLM() argument trtbuild knows; {hint}")
        return options


def has_draft(recipe: RecipeInfo) -> bool:
    draft = recipe.section(DraftConfig)
    return draft is not None and draft.source != "none"


def draft_len(config: EngineConfig, recipe: RecipeInfo) -> int | None:
    """Serve-time draft length: engine.draft_len, else the draft's max_draft_len; None without a draft."""
    draft = recipe.section(DraftConfig)
    if draft is None or draft.source == "none":
        return None
    return config.draft_len or draft.max_draft_len
