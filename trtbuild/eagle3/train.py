"""The EAGLE-3 training loop (online: the frozen target runs in every step) with resumable checkpoints.

ModelOpt's `HFEagleModel.forward` computes the target's hidden states and logits, unrolls the
draft `eagle_ttt_steps` times (training-time test) and returns the distillation loss and the
per-step top-1 agreement with the target. A checkpoint (draft weights, optimizer, step, loss
history) is written atomically to the resume dir every `checkpoint_every` steps, so a killed run
continues where it stopped; the batch order is a pure function of the seed.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtbuild.eagle3.model import draft_parameters
from trtbuild.progress import Progress

STATE_FILE = "state.pt"


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


@dataclass
class TrainResult:
    steps: int
    resumed_from: int
    seconds: float
    final_loss: float
    step_accuracy: list[float] = field(default_factory=list)  # per TTT step, smoothed
    estimated_tau: float = 0.0


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


def _save_atomically(state: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(model: nn.Module, pool: torch.Tensor, plan: TrainPlan, resume_dir: Path,
          progress: Progress) -> TrainResult:
    """Train `model.eagle_module` on `pool` [N, seq_len]; checkpoints in `resume_dir`."""
    torch.manual_seed(plan.seed)
    params = draft_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=plan.lr, weight_decay=plan.weight_decay, betas=(0.9, 0.95))
    order = batch_order(len(pool), plan.steps, plan.batch_size, plan.seed)
    state_path = Path(resume_dir) / STATE_FILE
    start, smoothed, loss_ema = 0, [], None
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        model.eagle_module.load_state_dict(state["draft"])
        optimizer.load_state_dict(state["optimizer"])
        start, smoothed, loss_ema = state["step"], state["accuracy"], state["loss"]
        progress.log(f"draft: resuming training at step {start}/{plan.steps} from {resume_dir}")

    model.train()
    began = time.perf_counter()
    with progress.task("draft: training EAGLE-3", plan.steps) as bar:
        if start:
            bar.advance(start)
        for step in range(start, plan.steps):
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, plan)
            batch = pool[order[step]]
            out = model(input_ids=batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, plan.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            accuracy = [float(a) for a in out.train_acc[0]]
            smoothed = accuracy if not smoothed else [0.9 * s + 0.1 * a for s, a in zip(smoothed, accuracy,
                                                                                         strict=True)]
            loss = out.loss.item()
            loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
            bar.advance(1, loss=loss_ema, acc=smoothed[0],
                        tau=estimated_tau(smoothed, plan.eval_draft_len))
            done = step + 1
            if done % plan.checkpoint_every == 0 and done < plan.steps:
                _save_atomically({"step": done, "draft": model.eagle_module.state_dict(),
                                  "optimizer": optimizer.state_dict(), "accuracy": smoothed,
                                  "loss": loss_ema}, state_path)
    model.eval()
    return TrainResult(steps=plan.steps, resumed_from=start, seconds=time.perf_counter() - began,
                       final_loss=float(loss_ema or 0.0), step_accuracy=smoothed,
                       estimated_tau=estimated_tau(smoothed, plan.eval_draft_len))
