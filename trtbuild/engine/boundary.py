"""The lazy `tensorrt_llm` boundary: the only module of trtbuild that imports it.

`probe()` answers whether TensorRT-LLM is installed without importing it (importing pulls CUDA,
MPI and TensorRT). With it installed and a GPU present, `load_check` loads the bundle through
`LLM()` and generates a few tokens: a small report for the stage's metrics, or BuildError with the
cause in one line.
"""

from __future__ import annotations

import importlib.util
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError

LOAD_CHECK_PROMPT = "def fibonacci(n):"
LOAD_CHECK_TOKENS = 8


def probe() -> str | None:
    """TensorRT-LLM's version when importable here, else None."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    for dist in ("tensorrt-llm", "tensorrt_llm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def load_check(model_dir: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Load the bundle with TensorRT-LLM's LLM API (PyTorch backend) and greedily generate a few tokens."""
    started = time.perf_counter()
    try:
        from tensorrt_llm import LLM, SamplingParams

        kwargs = {k: v for k, v in options.items() if k != "model"}
        llm = LLM(model=str(model_dir), **kwargs)
        try:
            outputs = llm.generate([LOAD_CHECK_PROMPT],
                                   SamplingParams(max_tokens=LOAD_CHECK_TOKENS, temperature=0.0))
        finally:
            llm.shutdown()
    except Exception as exc:  # anything TRT-LLM raises is a failed check of this bundle
        message = f"TensorRT-LLM could not load the bundle: {type(exc).__name__}: {exc}".splitlines()[0]
        raise BuildError(message, field="engine", fix="see llm_api_options.yaml and the server log") from None
    generated = len(outputs[0].outputs[0].token_ids)
    if generated == 0:
        raise BuildError("TensorRT-LLM loaded the bundle but generated no tokens", field="engine")
    return {"load_check": "ok", "load_check_tokens": generated,
            "load_check_seconds": round(time.perf_counter() - started, 1)}
