"""trtbuild's own PyTorch executor for the artifacts the pipeline builds.

Loads the target (HF Llama, unquantized or ModelOpt FP8) and the EAGLE-3 draft, and decodes
plain or speculatively (chain / dynamic tree) with a preallocated KV cache. Names are resolved
lazily so that importing `trtbuild.runtime.bench` for its config does not import torch.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "load_target": "trtbuild.runtime.target",
    "TargetModel": "trtbuild.runtime.target",
    "load_draft": "trtbuild.runtime.draft",
    "DraftModel": "trtbuild.runtime.draft",
    "Generator": "trtbuild.runtime.generate",
    "Generation": "trtbuild.runtime.generate",
    "Decoding": "trtbuild.runtime.generate",
    "SpecParams": "trtbuild.runtime.generate",
    "SamplingParams": "trtbuild.runtime.sampling",
    "DecodeStats": "trtbuild.runtime.stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trtbuild.runtime' has no attribute {name!r}")
