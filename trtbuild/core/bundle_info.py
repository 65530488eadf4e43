"""What the deploy stage reads from the engine bundle: bundle.json and llm_api_options.yaml.

The engine stage (trtbuild/engine/bundle.py) describes its bundle in bundle.json: which
directory TensorRT-LLM serves (`model`: target/), the tokenizer, the draft, the parallel sizes,
the server environment, the release it was written for and the GEMM-plugin module's directory.
The LLM() arguments (batch size, draft length, KV cache) are read through the engine's own typed
model, so both stages agree on every key.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError
from trtbuild.core.llm_args import read_options

BUNDLE_FORMAT_PREFIX = "trtbuild-engine-bundle/"


@dataclass(frozen=True)
class BundleInfo:
    root: Path
    backend: str  # "pytorch" (the only backend TensorRT-LLM keeps)
    served: str  # directory TRT-LLM loads, relative to root ("target")
    tokenizer: str  # relative to root
    draft: str | None  # relative to root, None without speculative decoding
    options: Any  # trtbuild.core.llm_args.LlmApiOptions
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    env: dict[str, str] = field(default_factory=dict)
    trtllm_version: str = "1.1.0"  # the release the bundle was written for (trtbuild/core/contract)
    python_path: str | None = None  # bundle dir the server's PYTHONPATH needs (the GEMM-plugin module)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def max_batch_size(self) -> int | None:
        return self.options.max_batch_size

    @property
    def max_draft_len(self) -> int | None:
        spec = self.options.speculative_config
        return spec.max_draft_len if spec is not None else None

    @property
    def hf_checkpoint(self) -> str | None:
        """The served Hugging Face directory when the project's runtime can load it (a config.json with
        architectures), else None."""
        try:
            data = json.loads((self.root / self.served / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return self.served if isinstance(data, dict) and data.get("architectures") else None

    def mapped(self, rel: str, mount: str) -> str:
        """A bundle-relative path as the server sees it with the bundle at `mount`."""
        return posixpath.normpath(posixpath.join(mount, rel))


def read_bundle(root: Path) -> BundleInfo:
    described = root / "bundle.json"
    try:
        info = json.loads(described.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"cannot read the engine bundle's description: {exc}", file=str(described),
                         fix="rebuild the engine stage (trtbuild engine RECIPE --force engine)") from None
    if not str(info.get("format", "")).startswith(BUNDLE_FORMAT_PREFIX):
        raise BuildError(f"unknown bundle format {info.get('format')!r}", file=str(described),
                         fix="rebuild the engine stage with this version of trtbuild")
    if info.get("backend", "pytorch") != "pytorch":
        raise BuildError(f"the bundle was built for backend {info.get('backend')!r}, which trtbuild no longer "
                         "serves", file=str(described), fix="rebuild the engine stage (trtbuild engine RECIPE "
                         "--force engine)")
    options = read_options(root / info.get("llm_api_options", "llm_api_options.yaml"))
    parallel = info.get("parallel") or {}
    served = info.get("model") or "target"
    return BundleInfo(
        root=root, backend=info.get("backend", "pytorch"), served=served,
        tokenizer=info.get("tokenizer") or served, draft=info.get("draft"), options=options,
        tensor_parallel=int(parallel.get("tensor", options.tensor_parallel_size)),
        pipeline_parallel=int(parallel.get("pipeline", options.pipeline_parallel_size)),
        env=dict(info.get("env") or {}),
        trtllm_version=str(info.get("trtllm_version") or "1.1.0"),
        python_path=(((info.get("gemm_plugin") or {}).get("loaded_by") or {}).get("triton_llmapi") or {})
        .get("python_path"))
