"""The repository for TensorRT-LLM's Triton backend, written from the bundle and the recipe.

The LLM-API model (TensorRT-LLM triton_backend/all_models/llmapi), the one Triton model of the
PyTorch backend:
    <model_name>/config.pbtxt     python backend; max_batch_size 0 and the decoupled policy equal
                                  to model.yaml's triton_config (its model.py auto-completes them
                                  from there, and the LLM batches inside: Triton must not)
    <model_name>/1/model.yaml     the bundle's LLM() arguments (paths under the bundle mount)
                                  + triton_config
The model.py files are TensorRT-LLM's own; the container launcher copies them from the image into a
writable copy of the repository at start, so the repository holds only our files. (The inflight-
batcher ensemble served TensorRT engines, a backend upstream removed; trtbuild no longer writes it.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtbuild.core.bundle_info import BundleInfo
from trtbuild.core.contract import load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.pbtxt import Enum, write_config

HEADER = "Written by trtbuild from the recipe and the engine bundle; paths are as the server sees them."

# The LLM-API model's tensors, model.yaml keys and request fields are the release's
# (trtbuild/core/contract: triton_llmapi), selected by the bundle's trtllm_version.


def map_path(value: str, bundle: BundleInfo, mount: str) -> str:
    """A path from llm_api_options.yaml (relative to the bundle root, where its launchers run) as the
    server sees it; absolute paths inside the bundle are remapped too, others are kept."""
    path = Path(value)
    if not path.is_absolute():
        return bundle.mapped(value, mount)
    try:
        return bundle.mapped(str(path.resolve().relative_to(bundle.root.resolve())), mount)
    except ValueError:
        return value


def llmapi_model_yaml(config: Any, bundle: BundleInfo, max_batch_size: int) -> dict[str, Any]:
    """model.yaml: the bundle's LLM() arguments with server-side paths, plus triton_config."""
    mount = config.trtllm.bundle_mount
    options = bundle.options.to_dict()
    args: dict[str, Any] = {"model": bundle.mapped(bundle.served, mount)}
    for key, value in options.items():
        if key == "model":
            continue
        if key == "tokenizer" and value:
            value = map_path(value, bundle, mount)
        args[key] = value
    if "tokenizer" not in args and bundle.tokenizer != bundle.served:
        args["tokenizer"] = bundle.mapped(bundle.tokenizer, mount)
    spec = args.get("speculative_config")
    for key in ("speculative_model_dir", "speculative_model"):
        if spec and spec.get(key):
            spec[key] = map_path(spec[key], bundle, mount)
    if max_batch_size < (args.get("max_batch_size") or max_batch_size + 1):
        args["max_batch_size"] = max_batch_size
        graphs = args.get("cuda_graph_config")
        if graphs and graphs.get("max_batch_size", 0) > max_batch_size:
            graphs["max_batch_size"] = max_batch_size
        if graphs and graphs.get("batch_sizes"):
            kept = [b for b in graphs["batch_sizes"] if b <= max_batch_size]
            graphs["batch_sizes"] = kept or [max_batch_size]
    args["triton_config"] = {
        # The LLM-API model does not take Triton-batched requests: batching happens inside the LLM.
        "max_batch_size": 0,
        "decoupled": config.decoupled,
        "cancellation_check_period_ms": config.trtllm.cancellation_check_period_ms,
    }
    return args


def _rows(rows: list[tuple]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        name, dtype, dims = row[:3]
        entry: dict[str, Any] = {"name": name, "data_type": Enum(dtype), "dims": dims}
        if len(row) > 3 and row[3]:
            entry["optional"] = True
        out.append(entry)
    return out


def _instances(count: int) -> list[dict[str, Any]]:
    return [{"count": count, "kind": Enum("KIND_CPU")}]


def write_llmapi(repo: Path, config: Any, bundle: BundleInfo, max_batch_size: int) -> dict[str, Any]:
    import yaml

    contract = load_contract(bundle.trtllm_version)
    model_dir = repo / config.model_name
    (model_dir / "1").mkdir(parents=True)
    cfg: dict[str, Any] = {
        "name": config.model_name,
        "backend": "python",
        "max_batch_size": 0,
        "model_transaction_policy": {"decoupled": config.decoupled},
        "input": _rows(contract.triton_inputs),
        "output": _rows(contract.triton_outputs),
        "instance_group": _instances(config.instance_count),
    }
    if config.instance_count > 1:
        # The LLM-API model needs each instance's GPUs: "0,1;2,3" gives instance 0 GPUs 0-1, ...
        ws = bundle.world_size
        cfg["parameters"] = {"gpu_device_ids": ";".join(
            ",".join(str(i * ws + g) for g in range(ws)) for i in range(config.instance_count))}
    write_config(model_dir, cfg,
                 header=HEADER + "\nTensorRT-LLM LLM-API model; model.py comes from the image.")
    args = llmapi_model_yaml(config, bundle, max_batch_size)
    cv.raise_first(cv.check_model_yaml(args, contract, f"{config.model_name}/1/model.yaml")
                   + cv.check_triton_io(cfg["input"], contract, f"{config.model_name}/config.pbtxt")
                   + cv.check_triton_parameters(cfg.get("parameters", {}), contract,
                                                f"{config.model_name}/config.pbtxt"),
                   fix=f"see docs/gpu-path.md (engine.trtllm_version: {contract.version})")
    text = ("# TensorRT-LLM LLM() arguments (the engine bundle's llm_api_options.yaml, paths under "
            f"{config.trtllm.bundle_mount}) + triton_config. Written by trtbuild.\n"
            + yaml.safe_dump(args, sort_keys=False, default_flow_style=False))
    (model_dir / "1" / "model.yaml").write_text(text)
    return {"kind": "llmapi", "models": [config.model_name], "entry_model": config.model_name,
            "trtllm_version": contract.version, "request_fields": contract.request_fields,
            "model_yaml": str((model_dir / "1" / "model.yaml").relative_to(repo.parent)),
            "python_models_from_image": {config.model_name: "llmapi/tensorrt_llm/1/*.py"}}


def write_trtllm_repository(repo: Path, config: Any, bundle: BundleInfo,
                            max_batch_size: int) -> dict[str, Any]:
    repo.mkdir(parents=True)
    info = write_llmapi(repo, config, bundle, max_batch_size)
    info.update({"bundle_mount": config.trtllm.bundle_mount, "backend": bundle.backend,
                 "max_batch_size": max_batch_size, "max_draft_len": bundle.max_draft_len,
                 "world_size": bundle.world_size})
    return info
