"""The EAGLE-3 training loop (online: the frozen target runs in every step; offline: its stored hidden
states are read instead) with resumable checkpoints.

ModelOpt's `HFEagleModel.forward` computes the target's hidden states and logits, unrolls the
draft `eagle_ttt_steps` times (training-time test; 4 fixed passes under ModelOpt 0.37) and returns
the distillation loss and the per-step top-1 agreement with the target. A checkpoint (draft weights, optimizer, step, loss
history) is written atomically to the resume dir every `checkpoint_every` steps, so a killed run
continues where it stopped; the batch order is a pure function of the seed.

Under torch.distributed (the stage launches the ranks with torchrun, `trtbuild.draft.distributed`)
the model is wrapped in DDP: each rank takes its contiguous shard of every global batch, DDP averages
the gradients of the parameters that require them (the draft's; the target is frozen), so a step
is the one-process step up to float32 summation order. Rank 0 alone writes checkpoints. The checkpoint is
tensors in safetensors and the rest in JSON, never a pickle: the resume dir lies in the cache, and a
file planted there must not run code on the next build.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtbuild.core.cache import sha256_file
from trtbuild.core.progress import Progress
from trtbuild.core.ranks import read_verified
from trtbuild.draft.model import draft_parameters
from trtbuild.draft.modelopt_compat import step_accuracy
from trtbuild.draft.sharding import ignore_for_ddp

STATE_TENSORS = "state.safetensors"
STATE_META = "state.json"  # step, accuracy, loss, optimizer param groups, and the tensors' sha256


@dataclass
class TrainPlan:
    steps: int
    batch_size: int
    lr: float
    seed: int
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    checkpoint_every: int = 50
    eval_draft_len: int = 3  # chain length for the running acceptance estimate
    device: str = "cpu"  # "cuda:<local rank>" on a GPU host
    autocast: str | None = None  # "bfloat16": the forward under torch.autocast (weights stay as they are)
    micro_batch_size: int | None = None  # sequences per forward; None: the process's whole shard


@dataclass
class TrainResult:
    steps: int
    resumed_from: int
    seconds: float  # the whole training's, the segments before a resume included
    final_loss: float
    step_accuracy: list[float] = field(default_factory=list)  # per TTT step, smoothed
    estimated_tau: float = 0.0
    losses: list[float] = field(default_factory=list)  # per step, the global batch's mean loss
    world_size: int = 1


def batch_order(n_samples: int, steps: int, batch_size: int, seed: int) -> torch.Tensor:
    """Indices of every step's batch: reshuffled each pass over the pool, fixed by the seed."""
    generator = torch.Generator().manual_seed(seed)
    needed = steps * batch_size
    chunks = [torch.randperm(n_samples, generator=generator) for _ in range(math.ceil(needed / n_samples))]
    return torch.cat(chunks)[:needed].view(steps, batch_size)


def estimated_tau(step_accuracy: list[float], draft_len: int) -> float:
    """Chain acceptance length if step i is accepted with probability acc[i] given its prefix was
    (steps beyond the unroll reuse the last accuracy): 1 + sum_j prod_{i<j} acc[i]."""
    if not step_accuracy:
        return 1.0
    tau, alive = 1.0, 1.0
    for j in range(draft_len):
        alive *= step_accuracy[min(j, len(step_accuracy) - 1)]
        tau += alive
    return tau


def _lr_at(step: int, plan: TrainPlan) -> float:
    if step < plan.warmup_steps:
        return plan.lr * (step + 1) / plan.warmup_steps
    progress = (step - plan.warmup_steps) / max(1, plan.steps - plan.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return plan.lr * (plan.min_lr_ratio + (1 - plan.min_lr_ratio) * cosine)


def save_state(resume_dir: Path, step: int, draft: nn.Module, optimizer: torch.optim.Optimizer,
               accuracy: list[float], loss: float | None, losses: list[float] | None = None,
               seconds: float = 0.0) -> None:
    """Tensors first, then the JSON that names their hash: a kill between the two leaves a pair that
    `load_state` rejects (it then starts over) instead of a mixed checkpoint."""
    from safetensors.torch import save_file

    optim = optimizer.state_dict()
    tensors = {f"draft.{k}": v.detach().contiguous().cpu() for k, v in draft.state_dict().items()}
    for index, slots in optim["state"].items():
        for name, value in slots.items():
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)
            tensors[f"optim.{index}.{name}"] = value.detach().contiguous().cpu()
    tensor_file, meta_file = resume_dir / STATE_TENSORS, resume_dir / STATE_META
    tmp = tensor_file.with_name(f".{tensor_file.name}.{os.getpid()}.tmp")
    meta_tmp = meta_file.with_name(f".{meta_file.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp))
        os.replace(tmp, tensor_file)
        meta = {"step": step, "accuracy": accuracy, "loss": loss, "param_groups": optim["param_groups"],
                "losses": list(losses or []), "seconds": seconds, "sha256": sha256_file(tensor_file)}
        meta_tmp.write_text(json.dumps(meta))
        os.replace(meta_tmp, meta_file)
    finally:  # a full disk leaves no partial file (the last complete checkpoint, if any, stays usable)
        tmp.unlink(missing_ok=True)
        meta_tmp.unlink(missing_ok=True)


def load_state(resume_dir: Path, draft: nn.Module, optimizer: torch.optim.Optimizer
               ) -> tuple[int, list[float], float | None, list[float], float] | None:
    """(step, accuracy, loss, per-step losses, seconds trained so far) after restoring `draft` and
    `optimizer`, or None when there is no complete checkpoint. Only safetensors and JSON are read
    (anything else in the dir is ignored)."""
    found = read_verified(resume_dir / STATE_TENSORS, resume_dir / STATE_META)
    if found is None:
        return None
    meta, tensors = found
    draft.load_state_dict({k[len("draft."):]: v for k, v in tensors.items() if k.startswith("draft.")})
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            slots.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": slots, "param_groups": meta["param_groups"]})
    losses = [float(x) for x in meta.get("losses", [])]
    return int(meta["step"]), [float(a) for a in meta["accuracy"]], meta["loss"], losses, float(meta.get("seconds", 0.0))


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _global_mean(values: list[float], world: int, device: torch.device) -> list[float]:
    """The mean over ranks of this rank's figures (the loss and accuracies of its shard)."""
    if world == 1:
        return values
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return (tensor / world).tolist()


def _on(device: torch.device, value: Any) -> Any:
    """`value` with every tensor in it (nested dicts: offline inputs) moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _on(device, v) for k, v in value.items()}
    return value


def _inputs(pool: torch.Tensor, rows: torch.Tensor, features: Callable[[torch.Tensor], dict[str, Any]] | None,
            loss_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    inputs = features(rows) if features is not None else {"input_ids": pool[rows]}
    if loss_mask is not None:
        inputs["loss_mask"] = loss_mask[rows]
    return inputs


def train(model: nn.Module, pool: torch.Tensor, plan: TrainPlan, resume_dir: Path,
          progress: Progress, features: Callable[[torch.Tensor], dict[str, Any]] | None = None,
          loss_mask: torch.Tensor | None = None) -> TrainResult:
    """Train `model.eagle_module` on `pool` [N, seq_len]; checkpoints in `resume_dir`. `features`
    (offline training): the model's inputs for a batch's pool rows (token ids and the target's stored
    hidden states); unset, the model runs the target on the token ids itself (online). `loss_mask`
    [N, seq_len]: where each row is trained (e.g. trtbuild.draft.data.answer_loss_mask; None: everywhere).

    Under an initialised process group every rank calls this with the same pool and plan."""
    torch.manual_seed(plan.seed)
    rank, world = _rank_world()
    device = torch.device(plan.device)
    model.to(device)
    params = draft_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=plan.lr, weight_decay=plan.weight_decay, betas=(0.9, 0.95))
    order = batch_order(len(pool), plan.steps, plan.batch_size, plan.seed)
    if plan.batch_size % world:
        raise ValueError(f"batch_size {plan.batch_size} does not split over {world} processes")
    shard = plan.batch_size // world
    micro = plan.micro_batch_size or shard
    if shard % micro:
        raise ValueError(f"micro_batch_size {micro} does not divide the shard of {shard} sequences")
    resume_dir = Path(resume_dir)
    start, smoothed, loss_ema, losses, earlier_seconds = 0, [], None, [], 0.0
    restored = load_state(resume_dir, model.eagle_module, optimizer)
    if restored is not None:
        start, smoothed, loss_ema, losses, earlier_seconds = restored
        losses = losses[:start]
        progress.log(f"draft: resuming training at step {start}/{plan.steps} from {resume_dir}")

    forward: nn.Module = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        # DDP synchronises the draft only: construction broadcasts rank 0's draft weights (every rank
        # loaded the same ones; this makes sure); the frozen target is every rank's own copy from disk,
        # or FSDP2's shards.
        ignore_for_ddp(model)
        forward = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = (torch.autocast(device.type, dtype=getattr(torch, plan.autocast)) if plan.autocast
                else nullcontext())
    micro_batches = shard // micro
    model.train()
    began = time.perf_counter()
    with progress.task("draft: training EAGLE-3", plan.steps) as bar:
        if start:
            bar.advance(start)
        for step in range(start, plan.steps):
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, plan)
            rows = order[step].view(world, shard)[rank]
            loss_sum, accuracy = 0.0, None
            for index, chunk in enumerate(rows.split(micro)):
                # DDP all-reduces on the last micro-batch's backward only (the others accumulate locally)
                sync = nullcontext() if world == 1 or index == micro_batches - 1 else forward.no_sync()  # type: ignore[operator]
                with sync:
                    with autocast:
                        out = forward(**_on(device, _inputs(pool, chunk, features, loss_mask)))
                    (out.loss / micro_batches).backward()
                loss_sum += out.loss.item()
                acc = step_accuracy(out.train_acc)
                accuracy = acc if accuracy is None else [a + b for a, b in zip(accuracy, acc, strict=True)]
            torch.nn.utils.clip_grad_norm_(params, plan.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            assert accuracy is not None
            figures = _global_mean([loss_sum / micro_batches] + [a / micro_batches for a in accuracy],
                                   world, device)
            loss, accuracy = figures[0], figures[1:]
            losses.append(loss)
            smoothed = accuracy if not smoothed else [0.9 * s + 0.1 * a for s, a in zip(smoothed, accuracy,
                                                                                         strict=True)]
            loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
            bar.advance(1, loss=loss_ema, acc=smoothed[0],
                        tau=estimated_tau(smoothed, plan.eval_draft_len))
            done = step + 1
            if rank == 0 and done % plan.checkpoint_every == 0 and done < plan.steps:
                save_state(resume_dir, done, model.eagle_module, optimizer, smoothed, loss_ema, losses,
                           earlier_seconds + time.perf_counter() - began)
    model.eval()
    return TrainResult(steps=plan.steps, resumed_from=start, seconds=earlier_seconds + time.perf_counter() - began,
                       final_loss=float(loss_ema or 0.0), step_accuracy=smoothed,
                       estimated_tau=estimated_tau(smoothed, plan.eval_draft_len), losses=losses,
                       world_size=world)
