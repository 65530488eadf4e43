"""Repositories for TensorRT-LLM's Triton backend, written from the bundle and the recipe.

engine.backend pytorch -> the LLM-API model (TensorRT-LLM triton_backend/all_models/llmapi):
    <model_name>/config.pbtxt     python backend; max_batch_size 0 and the decoupled policy equal
                                  to model.yaml's triton_config (its model.py auto-completes them
                                  from there, and the LLM batches inside: Triton must not)
    <model_name>/1/model.yaml     the bundle's LLM() arguments (paths under the bundle mount)
                                  + triton_config
engine.backend tensorrt -> the inflight batcher (all_models/inflight_batcher_llm):
    preprocessing, tensorrt_llm (backend tensorrtllm), postprocessing, <model_name> (the ensemble),
    and with deploy.trtllm.bls tensorrt_llm_bls; every template parameter is filled or left out
    (the C++ backend treats a missing optional parameter as unset). Three are read without a
    fallback by the backend and are always written: tokenizer_dir, guided_decoding_backend and
    xgrammar_tokenizer_info_path (the last two empty: no guided decoding).
The python models' model.py files are TensorRT-LLM's own; the container launcher copies them from
the image into a writable copy of the repository at start, so the repository holds only our files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtbuild.triton import ifb_schema as ifb
from trtbuild.triton.bundle_info import BundleInfo
from trtbuild.triton.pbtxt import Enum, write_config

HEADER = "Written by trtbuild from the recipe and the engine bundle; paths are as the server sees them."
TRTLLM_MODEL = "tensorrt_llm"  # the C++ backend model of the inflight batcher (BLS calls it by this name)

# The LLM-API model's tensors, model.yaml keys and request fields are the release's
# (trtbuild/contract: triton_llmapi), selected by the bundle's trtllm_version.


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

    from trtbuild.contract import load_contract
    from trtbuild.contract import validate as cv

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


# --- the inflight batcher ------------------------------------------------------------------------

def eagle_choices(max_draft_len: int) -> str:
    """A chain of max_draft_len draft tokens as EAGLE choices: {0},{0,0},... (top-1 at each depth).

    The format is what the backend's csvStrToVecVecInt parses: brace groups of comma-separated ints."""
    return ",".join("{" + ",".join(["0"] * depth) + "}" for depth in range(1, max_draft_len + 1))


def _dynamic_batching(config: Any, max_batch_size: int) -> dict[str, Any]:
    return {"preferred_batch_size": [max_batch_size],
            "max_queue_delay_microseconds": config.max_queue_delay_microseconds,
            "default_queue_policy": {"max_queue_size": config.max_queue_size}}


def _flag(value: bool) -> str:
    return "true" if value else "false"


def tensorrt_llm_parameters(config: Any, bundle: BundleInfo, tokenizer: str) -> dict[str, str]:
    mount = config.trtllm.bundle_mount
    kv = bundle.options.kv_cache_config
    kv_fraction = kv.free_gpu_memory_fraction if kv else None
    params = {
        "max_beam_width": str(bundle.options.max_beam_width or 1),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": bundle.mapped(bundle.engine_dir or bundle.served, mount),
        "batch_scheduler_policy": config.trtllm.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": str(kv_fraction if kv_fraction is not None else 0.9),
        "enable_kv_cache_reuse": _flag(kv.enable_block_reuse if kv else True),
        "exclude_input_in_output": _flag(config.trtllm.exclude_input_in_output),
        "enable_chunked_context": _flag(config.trtllm.enable_chunked_context),
        "cancellation_check_period_ms": str(config.trtllm.cancellation_check_period_ms),
        "executor_worker_path": "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker",
        "tokenizer_dir": tokenizer,
        # Read without a fallback by the backend; empty turns guided decoding off.
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }
    if kv and kv.max_tokens:
        params["max_tokens_in_paged_kv_cache"] = str(kv.max_tokens)
    if bundle.max_draft_len:
        params["decoding_mode"] = "eagle"
        params["eagle_choices"] = eagle_choices(bundle.max_draft_len)
    else:
        params["decoding_mode"] = "top_k_top_p"
    if config.instance_count > 1 or bundle.world_size > 1:
        ws = bundle.world_size
        params["gpu_device_ids"] = ";".join(",".join(str(i * ws + g) for g in range(ws))
                                            for i in range(config.instance_count))
    return params


def write_inflight_batcher(repo: Path, config: Any, bundle: BundleInfo, max_batch_size: int,
                           tokenizer: str) -> dict[str, Any]:
    logits = config.trtllm.logits_datatype
    count = config.instance_count
    tokenizer_params = {"tokenizer_dir": tokenizer}
    models: dict[str, dict[str, Any]] = {
        "preprocessing": {
            "name": "preprocessing", "backend": "python", "max_batch_size": max_batch_size,
            "dynamic_batching": _dynamic_batching(config, max_batch_size),
            "input": ifb.tensors(ifb.PREPROCESSING_INPUTS), "output": ifb.tensors(ifb.PREPROCESSING_OUTPUTS),
            "parameters": {**tokenizer_params,
                           "add_special_tokens": _flag(config.tokenizer.add_special_tokens),
                           "multimodal_model_path": "",
                           "gpt_model_path": bundle.mapped(bundle.engine_dir or bundle.served,
                                                           config.trtllm.bundle_mount)},
            "instance_group": _instances(count),
        },
        TRTLLM_MODEL: {
            "name": TRTLLM_MODEL, "backend": "tensorrtllm", "max_batch_size": max_batch_size,
            "model_transaction_policy": {"decoupled": config.decoupled},
            "dynamic_batching": _dynamic_batching(config, max_batch_size),
            "input": ifb.tensors(ifb.TENSORRT_LLM_INPUTS, logits),
            "output": ifb.tensors(ifb.TENSORRT_LLM_OUTPUTS, logits),
            "instance_group": _instances(1),  # one executor per server; it batches in flight
            "parameters": tensorrt_llm_parameters(config, bundle, tokenizer),
        },
        "postprocessing": {
            "name": "postprocessing", "backend": "python", "max_batch_size": max_batch_size,
            "dynamic_batching": {},
            "input": ifb.tensors(ifb.POSTPROCESSING_INPUTS),
            "output": ifb.tensors(ifb.POSTPROCESSING_OUTPUTS),
            "parameters": {**tokenizer_params,
                           "skip_special_tokens": _flag(config.tokenizer.skip_special_tokens)},
            "instance_group": _instances(count),
        },
        config.model_name: {
            "name": config.model_name, "platform": "ensemble", "max_batch_size": max_batch_size,
            "input": ifb.tensors(ifb.TEXT_INPUTS), "output": ifb.tensors(ifb.TEXT_OUTPUTS, logits),
            "ensemble_scheduling": {"step": [
                {"model_name": "preprocessing", "model_version": -1,
                 "input_map": ifb.ENSEMBLE_TO_PREPROCESSING, "output_map": ifb.PREPROCESSING_TO_ENSEMBLE},
                {"model_name": TRTLLM_MODEL, "model_version": -1,
                 "input_map": ifb.ENSEMBLE_TO_TENSORRT_LLM, "output_map": ifb.TENSORRT_LLM_TO_ENSEMBLE},
                {"model_name": "postprocessing", "model_version": -1,
                 "input_map": {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
                 "output_map": {"OUTPUT": "text_output"}},
            ]},
        },
    }
    from_image = {"preprocessing": "inflight_batcher_llm/preprocessing/1/model.py",
                  "postprocessing": "inflight_batcher_llm/postprocessing/1/model.py"}
    if config.trtllm.bls:
        models["tensorrt_llm_bls"] = {
            "name": "tensorrt_llm_bls", "backend": "python", "max_batch_size": max_batch_size,
            "model_transaction_policy": {"decoupled": config.decoupled},
            "input": ifb.tensors(ifb.TEXT_INPUTS + ifb.BLS_EXTRA_INPUTS),
            "output": ifb.tensors(ifb.TEXT_OUTPUTS, logits),
            "parameters": {"accumulate_tokens": "false", "tensorrt_llm_model_name": TRTLLM_MODEL,
                           "tensorrt_llm_draft_model_name": "", "multimodal_encoders_name": ""},
            "instance_group": _instances(count),
        }
        from_image["tensorrt_llm_bls"] = "inflight_batcher_llm/tensorrt_llm_bls/1/ (model.py, lib/)"
    for name, cfg in models.items():
        (repo / name / "1").mkdir(parents=True)
        if name == TRTLLM_MODEL:
            # Triton needs the version directory; the backend reads the engine from gpt_model_path.
            (repo / name / "1" / "README").write_text("The engine is read from gpt_model_path "
                                                      "(config.pbtxt).\n")
        write_config(repo / name, cfg, header=HEADER)
    return {"kind": "inflight_batcher", "models": sorted(models), "entry_model": config.model_name,
            "python_models_from_image": from_image}


def write_trtllm_repository(repo: Path, config: Any, bundle: BundleInfo,
                            max_batch_size: int) -> dict[str, Any]:
    repo.mkdir(parents=True)
    mount = config.trtllm.bundle_mount
    tokenizer = bundle.mapped(bundle.tokenizer, mount)
    if bundle.backend == "pytorch":
        info = write_llmapi(repo, config, bundle, max_batch_size)
    else:
        info = write_inflight_batcher(repo, config, bundle, max_batch_size, tokenizer)
    info.update({"bundle_mount": mount, "backend": bundle.backend, "max_batch_size": max_batch_size,
                 "max_draft_len": bundle.max_draft_len, "world_size": bundle.world_size,
                 "tokenizer_dir": tokenizer if bundle.backend == "tensorrt" else None})
    return info

