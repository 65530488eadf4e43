"""Draft training in several processes: torchrun launches the ranks, DDP averages the draft's gradients.

The stage (draft/build.py) prepares everything once in its own process: the training pool, the
draft vocabulary and the converted model's initial draft weights, written into the resume dir as
safetensors with a JSON job file. It then runs `python -m torch.distributed.run ... -m
trtbuild.draft.distributed <job.json>` (one node) or the same under `srun` (several nodes, Slurm,
c10d rendezvous). Every rank loads the target and the initial draft, joins the process group (gloo on
CPU, NCCL on GPUs) and runs `train.train` on its shard of every global batch; rank 0 writes the resume
checkpoints and, at the end, the trained draft weights with the result (`trained.*`). The stage reads
those back and exports the draft itself, so nothing a rank writes lands in the stage's artifact.

A failing rank writes one line (`error-rank<N>.txt`) before it exits; the launcher reports the first
such line. Rank 0 reports progress to the stage as `TRTBUILD_PROGRESS {json}` lines on stdout.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtbuild.core import ranks
from trtbuild.core.cache import sha256_file
from trtbuild.core.ranks import (  # noqa: F401 (the draft stage's build.py reads these from here)
    JOINED,
    LAUNCH_LOG,
    PROGRESS_PREFIX,
    in_slurm_allocation,
    read_verified,
    resolve_backend,
    resolve_device,
    slurm_head_node,
)
from trtbuild.core.ranks import atomic_write as _atomic

JOB_FILE = "job.json"
INIT_FILE = "init.safetensors"  # the converted model's draft weights before training (+ d2t)
TRAINED_FILE = "trained.safetensors"
RESULT_FILE = "trained.json"
SLURM_SCRIPT = "train_draft.sbatch"
MODULE = "trtbuild.draft.distributed"


@dataclass
class TrainJob:
    """Everything a rank needs, as plain JSON (paths, the architecture and the training plan)."""

    target_dir: str
    resume_dir: str
    pool_file: str
    arch: dict[str, Any]  # model.DraftArch fields
    plan: dict[str, Any]  # train.TrainPlan fields, device "cpu" or "cuda" (the rank adds its index)
    target_dtype: str  # how each rank loads the target: float32 (CPU) or bfloat16 (CUDA)
    backend: str  # gloo | nccl
    hidden_dir: str | None = None  # offline: the hidden-state shard set the ranks train from
    target_sharding: str = "none"  # fsdp: each rank holds 1/world of the target's layers (draft/sharding.py)


def resolve_autocast(dtype: str, device: str) -> str | None:
    """The forward's autocast dtype: bfloat16 on CUDA under auto; CPU stays float32 (today's numerics)."""
    if dtype == "auto":
        return "bfloat16" if device == "cuda" else None
    return None if dtype == "float32" else dtype


# ---------------------------------------------------------------- the stage's side


def write_job(job: TrainJob, model: Any) -> Path:
    """The job file and the initial draft weights (+ d2t buffer) every rank starts from."""
    from safetensors.torch import save_file

    resume = Path(job.resume_dir)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.eagle_module.state_dict().items()}
    _atomic(resume / INIT_FILE, lambda tmp: save_file(tensors, str(tmp)))
    _atomic(resume / JOB_FILE, lambda tmp: tmp.write_text(json.dumps(asdict(job), indent=1)))
    return resume / JOB_FILE


def read_result(resume: Path, model: Any) -> dict[str, Any] | None:
    """The finished training's result, with its weights loaded into `model.eagle_module`; None when
    there is none (or it does not match its recorded hash)."""
    found = read_verified(resume / TRAINED_FILE, resume / RESULT_FILE)
    if found is None:
        return None
    result, weights = found
    model.eagle_module.load_state_dict(weights)
    return result


def torchrun_argv(job_file: Path, processes: int, nodes: int = 1, rdzv_endpoint: str | None = None) -> list[str]:
    return ranks.torchrun_argv(job_file, processes, nodes, rdzv_endpoint, module=MODULE)


def srun_argv(job_file: Path, processes: int, nodes: int, head: str, port: int) -> list[str]:
    return ranks.srun_argv(job_file, processes, nodes, head, port, module=MODULE)


def slurm_script(job_file: Path, processes: int, nodes: int, slurm: Any, recipe_name: str = "") -> str:
    return ranks.slurm_script(job_file, processes, nodes, slurm, recipe_name, module=MODULE,
                              work="the draft stage's EAGLE-3 training", result="the trained weights")


def launch(argv: list[str], resume: Path, steps: int, progress: Any, description: str,
           rendezvous_s: float | None = None, meeting: str = "") -> None:
    ranks.launch(argv, resume, steps, progress, description, failure="draft: distributed training failed",
                 rendezvous_s=rendezvous_s, meeting=meeting, rendezvous_field="draft.train.slurm.rdzv_port")


# ---------------------------------------------------------------- a rank's side


class _RankProgress:
    """Rank 0's progress, as lines the launching stage parses; other ranks stay quiet."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.step = 0

    def log(self, message: str) -> None:
        if self.enabled:
            print(message, file=sys.stderr, flush=True)

    def task(self, description: str, total: float | None = None) -> Any:
        from contextlib import contextmanager

        outer = self

        class _Bar:
            def advance(self, n: float = 1, **fields: Any) -> None:
                outer.step += int(n)
                if outer.enabled and fields:
                    print(PROGRESS_PREFIX + json.dumps({"step": outer.step, **fields}), flush=True)

        @contextmanager
        def _task() -> Any:
            yield _Bar()

        return _task()


def run_rank(job_file: Path) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file

    from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target
    from trtbuild.draft.train import TrainPlan, train

    if os.environ.get("RANK", "0") == "0":
        print(JOINED, flush=True)  # this process exists: torchrun's rendezvous is done
    job = TrainJob(**json.loads(job_file.read_text()))
    resume = Path(job.resume_dir)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    plan = TrainPlan(**job.plan)
    if plan.device == "cuda":
        torch.cuda.set_device(local_rank)
        plan.device = f"cuda:{local_rank}"
    dist.init_process_group(job.backend, timeout=datetime.timedelta(minutes=30))
    try:
        rank = dist.get_rank()
        init = load_file(str(resume / INIT_FILE))
        features = None
        sharded: dict[str, int] = {}
        model = None
        if job.hidden_dir is not None:  # offline: the stored hidden states stand in for the target's layers
            from trtbuild.draft.hidden_store import HiddenStore, batches, load_head_only

            target = load_head_only(Path(job.target_dir))
            features = batches(HiddenStore(Path(job.hidden_dir)))
        elif job.target_sharding == "fsdp":  # each rank reads only its shards of the target
            from trtbuild.draft.sharded_load import build_sharded_target

            model, sharded = build_sharded_target(Path(job.target_dir), getattr(torch, job.target_dtype),
                                                  DraftArch(**job.arch), init, plan.device)
        else:
            target = load_target(Path(job.target_dir), dtype=getattr(torch, job.target_dtype))
        if model is None:
            model = convert_to_eagle3(target, DraftArch(**job.arch), init.get("d2t"))
            model.eagle_module.float()  # the draft trains in float32 (autocast, when on, casts the forward)
            model.eagle_module.load_state_dict(init)
        loaded = _peak_rss_all_ranks(plan.device)  # what holding the target cost, before training adds its own
        pool = load_file(job.pool_file)["pool"]
        result = train(model, pool, plan, resume, _RankProgress(rank == 0), features)  # type: ignore[arg-type]
        peak = _peak_rss_all_ranks(plan.device)
        if rank == 0:
            weights = {k: v.detach().contiguous().cpu() for k, v in model.eagle_module.state_dict().items()}
            _atomic(resume / TRAINED_FILE, lambda tmp: save_file(weights, str(tmp)))
            record = {**asdict(result), **sharded, "rank_peak_host_memory_bytes": peak,
                      "rank_peak_host_memory_loaded_bytes": loaded,
                      "sha256": sha256_file(resume / TRAINED_FILE)}
            _atomic(resume / RESULT_FILE, lambda tmp: tmp.write_text(json.dumps(record)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _peak_rss_all_ranks(device: str) -> int:
    """The largest peak resident memory of any rank, in bytes (Linux reports KiB)."""
    import resource

    import torch
    import torch.distributed as dist

    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.int64,
                        device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return int(peak.item())


def main() -> None:
    ranks.rank_main(run_rank)


if __name__ == "__main__":
    main()
