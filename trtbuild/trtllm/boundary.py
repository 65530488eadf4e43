"""The lazy `tensorrt_llm` boundary: the only module of trtbuild that imports it.

`probe()` answers whether TensorRT-LLM is installed without importing it (importing pulls CUDA,
MPI and TensorRT). With it installed and a GPU present, `build_engine` runs the bundle's legacy
commands and `load_check` loads the bundle through `LLM()` and generates a few tokens; both
return a small report for the stage's metrics, or raise BuildError with the cause in one line.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from trtbuild.errors import BuildError

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


def build_engine(bundle: Path, commands: list[list[str]], timeout_s: float = 6 * 3600) -> dict[str, Any]:
    """Run convert_checkpoint.py / trtllm-build in the bundle root (argv with ${VAR:-default} expanded)."""
    started = time.perf_counter()
    for argv in commands:
        expanded = [os.path.expandvars(_default_expand(a)) for a in argv]
        try:
            done = subprocess.run(expanded, cwd=bundle, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            message = f"{expanded[0]} could not run: {exc}".splitlines()[0]
            raise BuildError(message, field="engine.backend") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BuildError(f"{Path(expanded[0]).name} {expanded[1] if len(expanded) > 1 else ''} exited "
                             f"{done.returncode}: {tail[0]}", field="engine.backend",
                             fix="see build/build_engine.sh; run it by hand for the full log")
    return {"engine_built": True, "engine_build_seconds": round(time.perf_counter() - started, 1)}


def _default_expand(arg: str) -> str:
    """`${NAME:-default}` -> $NAME when set, else default (os.path.expandvars knows only ${NAME})."""
    import re

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}",
                  lambda m: os.environ.get(m.group(1), m.group(2)), arg)


def load_check(model_dir: Path, options: dict[str, Any], backend: str,
               tokenizer_dir: Path | None = None) -> dict[str, Any]:
    """Load the bundle with TensorRT-LLM's LLM API and greedily generate a few tokens."""
    started = time.perf_counter()
    try:
        if backend == "pytorch":
            from tensorrt_llm import LLM, SamplingParams
        else:
            from tensorrt_llm import SamplingParams
            from tensorrt_llm._tensorrt_engine import LLM
        kwargs = {k: v for k, v in options.items() if k != "model"}
        if tokenizer_dir is not None:
            kwargs["tokenizer"] = str(tokenizer_dir)
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
