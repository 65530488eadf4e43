"""The deploy stage's recipe section (`deploy:`): which Triton repositories are written, and how."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtbuild.core.shell import has_control
from trtbuild.core.stage_api import StageConfig
from trtbuild.deploy.dynamo_config import DynamoTargetOptions

Target = Literal["trtllm", "local", "dynamo"]


class TokenizerOptions(StageConfig):
    path: str | None = Field(default=None, description="local target: another tokenizer directory "
                             "(relative to the recipe); default, and always for trtllm: the bundle's "
                             "tokenizer.")
    add_special_tokens: bool = Field(default=True, description="Add BOS etc. when encoding prompts "
                                     "(preprocessing add_special_tokens).")
    skip_special_tokens: bool = Field(default=True, description="Drop special tokens when decoding "
                                      "(postprocessing skip_special_tokens).")


class TrtllmTargetOptions(StageConfig):
    image: str = Field(default="nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
                       description="Triton TRT-LLM container image the launchers run (its TensorRT-LLM "
                       "must match the one the bundle targets).")
    bundle_mount: str = Field(default="/bundle", description="Where the server sees the bundle: every "
                              "path in the repository is written under it (the container launcher mounts "
                              "the bundle there; on a bare host, give the bundle's absolute path).")
    all_models_dir: str = Field(default="/app/all_models", description="TensorRT-LLM's Triton models in the "
                                "image; the launcher copies their model.py files into the repository.")
    cancellation_check_period_ms: int = Field(default=100, ge=1, le=60000, description="How often cancelled "
                                              "requests are looked for.")
    publish_address: str = Field(default="127.0.0.1", description="Host address the container's ports are "
                                 "published on (docker -p ADDRESS:PORT:PORT); 0.0.0.0 opens them to the network.")

    @field_validator("image", "bundle_mount", "all_models_dir")
    @classmethod
    def _plain(cls, value: str) -> str:
        if not value or has_control(value) or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} must be non-empty, without whitespace or control characters")
        return value

    @field_validator("bundle_mount", "all_models_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or ":" in value:
            raise ValueError(f"{value!r} must be an absolute path in the container, without ':'")
        return value

    @field_validator("publish_address")
    @classmethod
    def _address(cls, value: str) -> str:
        import ipaddress

        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (e.g. 127.0.0.1, or 0.0.0.0 for all)") from None


class LocalTargetOptions(StageConfig):
    speculative: bool = Field(default=True, description="Use the bundle's EAGLE-3 draft (when it has one); "
                              "greedy output is identical either way, only faster.")
    speculation: Literal["chain", "tree"] = Field(default="chain", description="Draft shape: a chain of "
                                                  "max_draft_len tokens or a tree (single-stream runtime; the "
                                                  "served model batches requests and drafts chains).")
    default_max_tokens: int = Field(default=64, ge=1, le=1 << 20, description="Tokens generated when a request does not "
                                    "say (max_tokens).")
    max_tokens_limit: int = Field(default=1024, ge=1, le=1 << 20, description="Requests asking for more are refused "
                                  "(HTTP 400).")
    max_prompt_bytes: int = Field(default=1 << 20, ge=1, le=1 << 30, description="Prompts longer than this "
                                  "(UTF-8 bytes) are refused (HTTP 400) before they are decoded or tokenized.")
    num_threads: int | None = Field(default=None, ge=1, le=1024, description="torch threads of the model process "
                                    "(default: torch's own choice).")
    speculative_max_batch: int | None = Field(default=None, ge=1, le=1 << 16, description="Draft only while at most this "
                                              "many requests decode together (in-flight batching; a larger batch "
                                              "of plain rows already keeps a CPU busy). Default: always.")
    draft_len_schedule: dict[int, int] | None = Field(default=None, description="Draft length by batch size, with "
                                                      "TensorRT-LLM's draft_len_schedule meaning: each key is the "
                                                      "upper end of a band, so {\"4\": 5, \"8\": 3} drafts up to 5 "
                                                      "tokens while 1-4 requests decode together, 3 for 5-8 and none "
                                                      "above 8. Lengths above the deployment's max_draft_len are "
                                                      "capped at it. Default: max_draft_len at every batch size.")

    @field_validator("draft_len_schedule")
    @classmethod
    def _schedule(cls, value: dict[int, int] | None) -> dict[int, int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("is empty: leave it out, or give {\"<batch size>\": <draft length>, ...}")
        bad = [f"{size}: {n}" for size, n in value.items() if size < 1 or size > 1 << 16 or n < 0 or n > 64]
        if bad:
            raise ValueError(f"{', '.join(bad)}: batch sizes must be 1-65536 and draft lengths 0-64")
        return dict(sorted(value.items()))

    @model_validator(mode="after")
    def _one_gate(self) -> LocalTargetOptions:
        if self.draft_len_schedule is not None and self.speculative_max_batch is not None:
            raise ValueError("speculative_max_batch and draft_len_schedule are mutually exclusive (as TensorRT-LLM's "
                             "max_concurrency and draft_len_schedule): a schedule whose largest key is N already "
                             "stops drafting above N")
        return self


def _both_targets() -> list[Target]:
    return ["local", "trtllm"]


class DeployConfig(StageConfig):
    target: list[Target] = Field(default_factory=_both_targets, description="Repositories to "
                                 "write: trtllm (TensorRT-LLM's Triton backend), local (the project's "
                                 "runtime behind the python backend, for CPU rehearsal) and/or dynamo (NVIDIA "
                                 "Dynamo: DynamoGraphDeployments and one-node launchers for dynamo.trtllm).")
    model_name: str = Field(default="llm", description="Name clients call (/v2/models/<name>/generate).")
    max_batch_size: int | None = Field(default=None, ge=1, le=1 << 16, description="Most requests batched together; "
                                       "default and upper bound: the engine's max_batch_size.")
    instance_count: int = Field(default=1, ge=1, le=64, description="Model instances (instance_group count).")
    decoupled: bool = Field(default=True, description="Decoupled transaction policy: token streaming "
                            "(generate_stream, gRPC streams). Plain HTTP /infer needs it off.")
    max_queue_delay_microseconds: int = Field(default=0, ge=0, le=10**9, description="Dynamic batcher: how long a "
                                              "request may wait for others to batch with.")
    max_queue_size: int = Field(default=0, ge=0, le=10**7, description="Requests queued before new ones are refused "
                                "(0: unbounded).")
    tokenizer: TokenizerOptions = Field(default_factory=TokenizerOptions, description="Tokenizer options.")
    http_port: int = Field(default=8000, ge=1, le=65535, description="HTTP port (127.0.0.1 for `serve`).")
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="gRPC port.")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Prometheus metrics port.")
    openai_port: int = Field(default=8003, ge=1, le=65535, description="`serve` / `demo`: the OpenAI-compatible "
                             "API (/v1/models, /v1/completions, /v1/chat/completions) in front of the local model.")
    exit_timeout_s: int = Field(default=30, ge=1, le=86400, description="On shutdown, how long in-flight requests may "
                                "take to finish.")
    trtllm: TrtllmTargetOptions = Field(default_factory=TrtllmTargetOptions, description="trtllm target.")
    local: LocalTargetOptions = Field(default_factory=LocalTargetOptions, description="local target.")
    dynamo: DynamoTargetOptions = Field(default_factory=DynamoTargetOptions, description="dynamo target.")

    @field_validator("target", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("target")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one target: trtllm, local, dynamo")
        return list(dict.fromkeys(value))

    @field_validator("model_name")
    @classmethod
    def _model_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise ValueError(f"'{value}' is not a usable model name (letters, digits, _ . -)")
        return value
