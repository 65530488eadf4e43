"""The `local` repository: one python-backend model serving the project's runtime.

    repo_local/<model_name>/config.pbtxt
    repo_local/<model_name>/1/model.py      (trtbuild/deploy/local_model.py, copied)

The model's parameters name the bundle's target, draft and tokenizer relative to the model
directory (through the deploy artifact's `bundle` link), so the repository keeps working when
the cache moves as a whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trtbuild.core.bundle_info import BundleInfo
from trtbuild.core.errors import UserError
from trtbuild.core.pbtxt import Enum, write_config

MODEL_SOURCE = Path(__file__).with_name("local_model.py")

INPUTS = [
    ("text_input", "TYPE_STRING", False),
    ("max_tokens", "TYPE_INT32", True),
    ("temperature", "TYPE_FP32", True),
    ("top_k", "TYPE_INT32", True),
    ("top_p", "TYPE_FP32", True),
    ("seed", "TYPE_UINT64", True),
    ("stream", "TYPE_BOOL", True),
    ("speculative", "TYPE_BOOL", True),
]


def local_config(config: Any, bundle: BundleInfo, model_dir: Path, bundle_link: Path,
                 max_batch_size: int, tokenizer_dir: Path | None) -> dict[str, Any]:
    hf = bundle.hf_checkpoint
    if hf is None:
        raise UserError("deploy.target local needs a Hugging Face checkpoint in the bundle, and this "
                        f"{bundle.backend} bundle has none (its target is a TensorRT-LLM checkpoint)",
                        field="deploy.target",
                        fix="drop `local` from deploy.target, or use engine.backend pytorch")

    def rel(path: Path) -> str:
        return os.path.relpath(path, model_dir)

    speculative = bool(config.local.speculative and bundle.draft)
    spec = bundle.options.speculative_config
    params = {
        "target_dir": rel(bundle_link / hf),
        "draft_dir": rel(bundle_link / bundle.draft) if bundle.draft else "",
        "tokenizer_dir": str(tokenizer_dir) if tokenizer_dir else rel(bundle_link / bundle.tokenizer),
        "speculative": "true" if speculative else "false",
        "speculation": config.local.speculation,
        "max_draft_len": str(bundle.max_draft_len or ""),
        "max_total_draft_tokens": str(spec.max_total_draft_tokens or "") if spec else "",
        "add_special_tokens": "true" if config.tokenizer.add_special_tokens else "false",
        "skip_special_tokens": "true" if config.tokenizer.skip_special_tokens else "false",
        "default_max_tokens": str(min(config.local.default_max_tokens, config.local.max_tokens_limit)),
        "max_tokens_limit": str(config.local.max_tokens_limit),
        "max_prompt_bytes": str(config.local.max_prompt_bytes),
        "num_threads": str(config.local.num_threads or ""),
        "speculative_max_batch": str(config.local.speculative_max_batch or ""),
        "draft_len_schedule": json.dumps(config.local.draft_len_schedule) if config.local.draft_len_schedule else "",
    }
    return {
        "name": config.model_name,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "model_transaction_policy": {"decoupled": config.decoupled},
        "dynamic_batching": {
            "max_queue_delay_microseconds": config.max_queue_delay_microseconds,
            "default_queue_policy": {"max_queue_size": config.max_queue_size},
        },
        "input": [{"name": name, "data_type": Enum(dtype), "dims": [1], **({"optional": True} if opt else {})}
                  for name, dtype, opt in INPUTS],
        "output": [{"name": "text_output", "data_type": Enum("TYPE_STRING"), "dims": [1]},
                   {"name": "output_ids", "data_type": Enum("TYPE_INT32"), "dims": [-1]}],
        "instance_group": [{"count": config.instance_count, "kind": Enum("KIND_CPU")}],
        "parameters": params,
    }


def write_local_repository(repo: Path, config: Any, bundle: BundleInfo, bundle_link: Path,
                           max_batch_size: int, tokenizer_dir: Path | None) -> dict[str, Any]:
    model_dir = repo / config.model_name
    (model_dir / "1").mkdir(parents=True)
    cfg = local_config(config, bundle, model_dir, bundle_link, max_batch_size, tokenizer_dir)
    write_config(model_dir, cfg, header="Written by trtbuild: the project's runtime behind Triton's python "
                 "backend (CPU rehearsal).")
    (model_dir / "1" / "model.py").write_text(MODEL_SOURCE.read_text())
    params = cfg["parameters"]
    return {"model": config.model_name, "speculative": params["speculative"] == "true",
            "target_dir": params["target_dir"], "draft_dir": params["draft_dir"] or None,
            "tokenizer_dir": params["tokenizer_dir"]}
