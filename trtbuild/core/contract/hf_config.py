"""config.json in the form every supported release reads: RoPE at the top level.

transformers 5 writes RoPE only as `rope_parameters` ({rope_theta, rope_type, factor, ...}); the
transformers 4.57 of TensorRT-LLM 1.1 reads top-level `rope_theta` and `rope_scaling` and, without
them, runs with rope_theta 10000 and no llama3 scaling. `legacy_rope_keys` adds the top-level keys
(keeping `rope_parameters`, which transformers 5 reads), and `torch_dtype` beside `dtype`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _fix_block(block: dict[str, Any]) -> dict[str, Any]:
    params = block.get("rope_parameters")
    if not isinstance(params, dict):
        return block
    out = dict(block)
    if out.get("rope_theta") is None and params.get("rope_theta") is not None:
        out["rope_theta"] = params["rope_theta"]
    kind = params.get("rope_type") or params.get("type") or "default"
    scaling = out.get("rope_scaling")
    if kind == "default":
        out.setdefault("rope_scaling", None)
    elif not (isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type"))):
        out["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"} | {"rope_type": kind}
    if "dtype" in out and "torch_dtype" not in out:
        out["torch_dtype"] = out["dtype"]
    return out


def legacy_rope_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The config with top-level rope_theta / rope_scaling (and text_config's, for Llama 4)."""
    out = _fix_block(config)
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = _fix_block(out["text_config"])
    return out


def rewrite_config(path: Path) -> bool:
    """Rewrite config.json in place (atomically) when keys are missing; True if it changed.

    A hard-linked file is replaced, not written through, so the input artifact stays untouched."""
    config = json.loads(Path(path).read_text())
    fixed = legacy_rope_keys(config)
    if fixed == config:
        return False
    tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}")
    tmp.write_text(json.dumps(fixed, indent=2) + "\n")
    os.replace(tmp, path)
    return True
