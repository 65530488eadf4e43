"""`deploy.dynamo`: the NVIDIA Dynamo target's options (trtbuild.deploy.dynamo writes the deployment)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from trtbuild.core.stage_api import StageConfig

# The tensorrtllm-runtime image of the Dynamo release in trtbuild/core/contract/dynamo-1.6.1.yaml (release.image).
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1"
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class DynamoTargetOptions(StageConfig):
    image: str = Field(default=DYNAMO_IMAGE, description="Dynamo's tensorrtllm-runtime image (frontend and workers); "
                       "its TensorRT-LLM is the one Dynamo pins (1.3.0rc29 for Dynamo 1.6.1).")
    bundle_mount: str = Field(default="/bundle", description="Where the workers see the bundle (read-only volume); "
                              "every path in the engine args is written under it.")
    bundle_claim: str = Field(default="trtbuild-bundle", description="Kubernetes: the PersistentVolumeClaim that holds "
                              "the bundle at its root (copy it there with `cp -rL deploy/bundle/. ...`).")
    hf_token_secret: str = Field(default="hf-token-secret", description="Kubernetes: the Secret whose keys "
                                 "(HF_TOKEN) every worker gets as environment (envFrom), as upstream's examples do.")
    http_port: int = Field(default=8000, ge=1, le=65535, description="The frontend's OpenAI port.")
    router_mode: Literal["round-robin", "random", "kv"] = Field(
        default="round-robin", description="The frontend's router; kv also makes the workers publish KV events.")
    workers: int = Field(default=1, ge=1, le=1024, description="Aggregated deployment: worker replicas "
                         "(each with tensor_parallel x pipeline_parallel GPUs).")
    prefill_workers: int = Field(default=1, ge=1, le=1024, description="Disaggregated deployment: prefill replicas.")
    decode_workers: int = Field(default=1, ge=1, le=1024, description="Disaggregated deployment: decode replicas.")

    @field_validator("bundle_mount")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or ":" in value or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} must be an absolute path in the container, without ':' or whitespace")
        return value

    @field_validator("bundle_claim", "hf_token_secret")
    @classmethod
    def _k8s_name(cls, value: str) -> str:
        if len(value) > 63 or not _K8S_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a Kubernetes object name (lowercase letters, digits, '-', at most 63)")
        return value

    @field_validator("image")
    @classmethod
    def _plain(cls, value: str) -> str:
        if not value or any(c.isspace() or ord(c) < 32 for c in value):
            raise ValueError(f"{value!r} must be non-empty, without whitespace or control characters")
        return value
