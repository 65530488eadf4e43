"""source: train, end to end: data -> (offline: hidden states) -> vocab calibration -> ModelOpt
conversion -> training -> export.

Training runs in this process (`draft.train` at one process: CPU float32, or CUDA with a bf16 target)
or in torchrun ranks (draft/distributed.py) that start from this process's converted draft and hand
the trained weights back; either way this process exports.

The training pool (trtbuild/draft/draft_data.py) and, offline, the target's hidden states
(trtbuild/draft/hidden.py) are shard sets of their own in the cache; the training state lives in
the resume dir, so a killed build restarts from its last checkpoint; the resume dir is removed once
the export is complete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.errors import BuildError, UserError
from trtbuild.draft import distributed as dist_train
from trtbuild.draft import rendezvous
from trtbuild.draft.compat import check_compatible
from trtbuild.draft.distributed import resolve_autocast, resolve_backend, resolve_device
from trtbuild.draft.draft_data import ensure_data, load_pool
from trtbuild.draft.format import default_aux_layers
from trtbuild.draft.hidden import ensure_hidden
from trtbuild.draft.hidden_store import HiddenStore, batches, load_head_only
from trtbuild.draft.shards import shard_bytes
from trtbuild.draft.vocab import calibrate_d2t

if TYPE_CHECKING:
    from trtbuild.core.stage_api import StageContext
    from trtbuild.draft.config import DraftConfig

RANK_POOL_FILE = "pool.safetensors"  # the pool as the ranks read it (resume dir); never a pickle
TRAIN_LOG = "train_log.json"  # in the artifact: the global batch's loss at every step, where it ran


def resolve_aux_layers(config: DraftConfig, num_layers: int) -> list[int]:
    if config.aux_layers is None:
        return default_aux_layers(num_layers)
    bad = [i for i in config.aux_layers if not 0 <= i < num_layers]
    if bad:
        raise UserError(f"aux layer {bad[0]} is outside the target's {num_layers} layers "
                        f"(0..{num_layers - 1})", field="draft.aux_layers",
                        fix="pick layer indices of the target")
    if len(set(config.aux_layers)) != len(config.aux_layers):
        raise UserError(f"aux_layers {config.aux_layers} repeat a layer", field="draft.aux_layers")
    return sorted(config.aux_layers)


def _export_dtype(config: DraftConfig, target: Any) -> str:
    if config.export_dtype != "auto":
        return config.export_dtype
    import torch

    dtype = getattr(target.config, "dtype", None) or getattr(target.config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(dtype, "float32")


def train_draft(config: DraftConfig, ctx: StageContext, target_dir: Path, out: Path,
                resume: Path, target_key: str = "") -> dict[str, Any]:
    import torch
    from transformers import AutoConfig

    from trtbuild.draft.export import export_draft
    from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target
    from trtbuild.draft.modelopt_compat import effective_ttt_steps, ignored_settings
    from trtbuild.draft.train import TrainPlan, train

    torch.manual_seed(config.seed)
    text_config = AutoConfig.from_pretrained(str(target_dir)).get_text_config()
    vocab_size, num_layers = int(text_config.vocab_size), int(text_config.num_hidden_layers)
    aux_layers = resolve_aux_layers(config, num_layers)
    draft_vocab = config.draft_vocab_size or vocab_size
    if draft_vocab > vocab_size:
        raise UserError(f"draft_vocab_size {draft_vocab} > target vocab_size {vocab_size}",
                        field="draft.draft_vocab_size", fix=f"use at most {vocab_size}")

    resume.mkdir(parents=True, exist_ok=True)
    # The pool and (offline) the hidden states are shard sets of their own in the cache, keyed without
    # the training settings: another lr or step count finds them again.
    data = ensure_data(config, target_dir, target_key or str(target_dir), ctx.recipe.base_dir, ctx.progress)
    pool = load_pool(data.path)[: config.used_samples()]  # rows i of the pool are rows i of the hidden states
    features, hidden = None, None
    if config.hidden_states == "offline":
        hidden = ensure_hidden(data, target_dir, aux_layers, config.hidden_states_dtype, ctx.progress)
        features = batches(HiddenStore(hidden.path))
        target = load_head_only(target_dir)
    else:
        target = load_target(target_dir)
    torch.manual_seed(config.training_seed())  # the initialisation does not depend on what ran before
    export_dtype = _export_dtype(config, target)

    d2t, coverage = None, 1.0
    if draft_vocab < vocab_size:
        d2t, coverage = calibrate_d2t(pool.flatten().tolist(), vocab_size, draft_vocab)
    arch = DraftArch(aux_layers=aux_layers, draft_vocab_size=draft_vocab,
                     intermediate_size=config.intermediate_size, ttt_steps=config.ttt_steps,
                     loss_decay=config.loss_decay, offline=config.hidden_states == "offline")
    model = convert_to_eagle3(target, arch, d2t)
    for note in ignored_settings(config.ttt_steps, config.loss_decay):
        ctx.progress.log(f"draft: {note} (the TensorRT-LLM 1.1 container's release)")
    placement = training_placement(config, sum(f.stat().st_size for f in target_dir.glob("*.safetensors")))
    plan = TrainPlan(steps=config.total_steps(), batch_size=config.batch_size, lr=config.lr, seed=config.training_seed(),
                     warmup_steps=min(10, max(1, config.total_steps() // 10)),
                     checkpoint_every=config.checkpoint_every, eval_draft_len=config.max_draft_len,
                     device=placement["device"], autocast=placement["autocast"],
                     micro_batch_size=config.train.micro_batch_size)
    if config.train.world_size() == 1:
        if placement["target_dtype"] != "float32":  # frozen target in bf16; the draft trains in float32
            model.to(getattr(torch, placement["target_dtype"]))
            model.eagle_module.float()
        result = asdict(train(model, pool, plan, resume, ctx.progress, features))
    else:
        result = train_distributed(config, ctx, model, plan, placement, target_dir, resume, arch, pool,
                                   hidden.path if hidden is not None else None)
    model.to("cpu")
    exported = export_draft(model, out, target_dir=target_dir, dtype=export_dtype)
    check_compatible(out, target_dir, where="draft")  # our own export must pass the loader's checks
    (ctx.out_dir / TRAIN_LOG).write_text(json.dumps(
        {"losses": result["losses"], "world_size": result["world_size"], "device": placement["device"],
         "autocast": placement["autocast"], "resumed_from_step": result["resumed_from"]}) + "\n")
    shutil.rmtree(resume, ignore_errors=True)

    metrics = {
        "train_steps": result["steps"],
        "train_seconds": round(result["seconds"], 1),
        "train_step_seconds": round(result["seconds"] / max(1, result["steps"]), 4),
        "train_processes": result["world_size"],
        "train_target_sharding": placement["target_sharding"],
        "train_device": placement["device"],
        "data_seconds": round(data.seconds, 1),
        "train_loss": round(result["final_loss"], 4),
        "train_step_accuracy": [round(a, 4) for a in result["step_accuracy"]],
        "train_estimated_tau": round(result["estimated_tau"], 3),
        "vocab_coverage": round(coverage, 4),
        "pool_sequences": int(pool.shape[0]),
        "pool_tokens": int(pool.numel()),
    }
    info: dict[str, Any] = {
        "resumed_from_step": result["resumed_from"], "export": exported,
        "trainer": f"modelopt.torch.speculative eagle3 ({config.hidden_states}, frozen target)"
                   + (f", DDP over {result['world_size']} processes" if result["world_size"] > 1 else "")
                   + (", target layers FSDP2-sharded" if placement["target_sharding"] == "fsdp" else ""),
        "aux_layers": aux_layers, "ttt_steps": effective_ttt_steps(config.ttt_steps),
        "data": _set_info(data)}
    for name in ("target_layer_parameters", "target_layer_parameters_per_rank", "target_bytes_read_per_rank",
                 "rank_peak_host_memory_bytes", "rank_peak_host_memory_loaded_bytes"):
        if name in result:
            metrics[name] = result[name]
    if hidden is not None:
        metrics["dump_seconds"] = round(hidden.seconds, 1)
        metrics["hidden_states_bytes"] = shard_bytes(hidden.path)
        info["hidden_states"] = _set_info(hidden)
    return {"metrics": metrics, "info": info}


def _set_info(found: Any) -> dict[str, Any]:
    return {"path": str(found.path), "key": found.key, "reused": found.reused, "shards_computed": found.computed,
            "shards_kept": found.kept}


def training_placement(config: DraftConfig, target_bytes: int = 0) -> dict[str, Any]:
    """Device, forward autocast dtype and target dtype of the training, from `draft.train`."""
    device = resolve_device(config.train.device)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("draft.train.device is cuda but torch sees no GPU", field="draft.train.device",
                            fix="use auto or cpu, or run on a GPU host with a CUDA build of torch")
    autocast = resolve_autocast(config.train.dtype, device)
    backend = resolve_backend(config.train.backend, device)
    if backend == "nccl" and device != "cuda":
        raise UserError("draft.train.backend nccl needs device cuda", field="draft.train.backend",
                        fix="use backend gloo (or auto) on the CPU")
    target_dtype = "bfloat16" if device == "cuda" and autocast == "bfloat16" else "float32"
    return {"device": device, "autocast": autocast, "backend": backend, "target_dtype": target_dtype,
            "target_sharding": _target_sharding(config, device, target_bytes, target_dtype)}


def _target_sharding(config: DraftConfig, device: str, target_bytes: int, target_dtype: str) -> str:
    """fsdp or none (draft/sharding.py); target_bytes: the checkpoint's files, taken as 16-bit weights."""
    from trtbuild.draft.sharding import resolve

    if config.hidden_states == "offline":
        return "none"  # the ranks hold the target's head only
    gpu_bytes = None
    if device == "cuda":
        import torch

        gpu_bytes = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    held = target_bytes if target_dtype == "bfloat16" else 2 * target_bytes
    return resolve(config.train.target_sharding, device, config.train.world_size(), held, gpu_bytes)


def train_distributed(config: DraftConfig, ctx: StageContext, model: Any, plan: Any, placement: dict[str, Any],
                      target_dir: Path, resume: Path, arch: Any, pool: Any, hidden_dir: Path | None
                      ) -> dict[str, Any]:
    """Launch the ranks (torchrun; under Slurm for several nodes), then load the trained draft into `model`.
    Offline (`hidden_dir`), each rank reads the hidden-state shards and holds only the target's head."""
    from safetensors.torch import save_file

    settings = config.train
    done = dist_train.read_result(resume, model)  # a finished run whose export was interrupted
    if done is not None:
        ctx.progress.log(f"draft: using the finished distributed training in {resume}")
        done["resumed_from"] = done["steps"]
        return done
    pool_file = resume / RANK_POOL_FILE
    tmp = pool_file.with_name(f".{pool_file.name}.tmp")
    save_file({"pool": pool.contiguous()}, str(tmp))
    tmp.replace(pool_file)
    job = dist_train.TrainJob(target_dir=str(target_dir.resolve()), resume_dir=str(resume.resolve()),
                              pool_file=str(pool_file.resolve()), arch=asdict(arch),
                              plan=asdict(plan), target_dtype=placement["target_dtype"],
                              backend=placement["backend"],
                              hidden_dir=str(hidden_dir.resolve()) if hidden_dir is not None else None,
                              target_sharding=placement["target_sharding"])
    job_file = dist_train.write_job(job, model)
    what = f"draft: training EAGLE-3 ({settings.processes} processes x {settings.nodes} nodes, {placement['backend']})"
    meeting: dict[str, Any] = {}
    if settings.nodes == 1:
        argv = dist_train.torchrun_argv(job_file, settings.processes)
    elif dist_train.in_slurm_allocation(settings.nodes):
        head = dist_train.slurm_head_node()
        problem = rendezvous.port_problem(head, settings.slurm.rdzv_port)
        if problem is not None:
            raise UserError(problem, field="draft.train.slurm.rdzv_port",
                            fix="set draft.train.slurm.rdzv_port to a port nothing listens on")
        argv = dist_train.srun_argv(job_file, settings.processes, settings.nodes, head, settings.slurm.rdzv_port)
        meeting = {"rendezvous_s": rendezvous.RENDEZVOUS_TIMEOUT_S, "meeting": f"{head}:{settings.slurm.rdzv_port}"}
    else:
        script = resume / dist_train.SLURM_SCRIPT
        script.write_text(dist_train.slurm_script(job_file, settings.processes, settings.nodes, settings.slurm,
                                                  ctx.recipe.name))
        script.chmod(0o755)
        raise UserError(f"draft.train.nodes {settings.nodes} needs a Slurm allocation of that many nodes; "
                        f"the job is prepared: sbatch {script}, then run the same build again",
                        field="draft.train.nodes",
                        fix="submit the script (or run the build inside salloc/sbatch), or set nodes: 1")
    dist_train.launch(argv, resume, plan.steps, ctx.progress, what, **meeting)
    result = dist_train.read_result(resume, model)
    if result is None:
        raise BuildError(f"draft: the training processes exited without a result in {resume}",
                         fix=f"see {resume / dist_train.LAUNCH_LOG}")
    return result

