"""Draft training in several processes: torchrun launches the ranks, DDP averages the draft's gradients.

The stage (eagle3/build.py) prepares everything once in its own process: the training pool, the
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

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

JOB_FILE = "job.json"
INIT_FILE = "init.safetensors"  # the converted model's draft weights before training (+ d2t)
TRAINED_FILE = "trained.safetensors"
RESULT_FILE = "trained.json"
LAUNCH_LOG = "launch.log"
SLURM_SCRIPT = "train_draft.sbatch"
PROGRESS_PREFIX = "TRTBUILD_PROGRESS "
JOINED = "TRTBUILD_RANKS_JOINED"  # rank 0's first line: torchrun started the ranks, so the nodes met


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
    target_sharding: str = "none"  # fsdp: each rank holds 1/world of the target's layers (eagle3/sharding.py)


def resolve_device(device: str) -> str:
    """auto: cuda when torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_backend(backend: str, device: str) -> str:
    return backend if backend != "auto" else ("nccl" if device == "cuda" else "gloo")


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
    from trtbuild.draft.train import read_verified

    found = read_verified(resume / TRAINED_FILE, resume / RESULT_FILE)
    if found is None:
        return None
    result, weights = found
    model.eagle_module.load_state_dict(weights)
    return result


def torchrun_argv(job_file: Path, processes: int, nodes: int = 1, rdzv_endpoint: str | None = None,
                  module: str = "trtbuild.draft.distributed") -> list[str]:
    """torchrun for one node (--standalone: a local rendezvous on a free port) or one node of several;
    each rank runs `python -m <module> <job_file>` (the quantize stage's calibration ranks use it too)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}", "--max-restarts=0"]
    if nodes == 1:
        launcher.append("--standalone")
    else:
        launcher += [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                     f"--rdzv-id=trtbuild-{module.split('.')[1]}"]
    return [*launcher, "-m", module, str(job_file)]


def srun_argv(job_file: Path, processes: int, nodes: int, head: str, port: int,
              module: str = "trtbuild.draft.distributed") -> list[str]:
    """One torchrun per node under srun, meeting at the allocation's first node."""
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            *torchrun_argv(job_file, processes, nodes, f"{head}:{port}", module)]


def in_slurm_allocation(nodes: int) -> bool:
    try:
        return "SLURM_JOB_ID" in os.environ and int(os.environ.get("SLURM_JOB_NUM_NODES", "0")) >= nodes
    except ValueError:
        return False


def slurm_head_node() -> str:
    """The allocation's first host (scontrol expands SLURM_JOB_NODELIST)."""
    listed = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                            capture_output=True, text=True, check=True).stdout.split()
    return listed[0]


def slurm_script(job_file: Path, processes: int, nodes: int, slurm: Any, recipe_name: str = "",
                 module: str = "trtbuild.draft.distributed",
                 work: str = "the draft stage's EAGLE-3 training", result: str = "the trained weights") -> str:
    """sbatch script: one torchrun per node (srun), c10d rendezvous on the first node of the allocation."""
    from trtbuild.core.shell import comment_safe, default_assignment, quote, sbatch_directives

    directives = sbatch_directives(job_name=slurm.job_name, nodes=nodes, tasks_per_node=1,
                                   gpus_per_node=processes, time_limit=slurm.time_limit,
                                   output=f"{slurm.job_name}-%j.out", partition=slurm.partition, account=slurm.account)
    recipe = f" for recipe '{comment_safe(recipe_name)}'" if recipe_name else ""
    endpoint = f'--rdzv-endpoint="${{HEAD}}:{slurm.rdzv_port}"'  # HEAD: set by the script itself
    words = ['"${TRTBUILD_PYTHON}"'] + [endpoint if a.startswith("--rdzv-endpoint=") else quote(a)
                                        for a in torchrun_argv(job_file, processes, nodes, "HEAD", module)[1:]]
    return ("#!/bin/bash\n" + "\n".join(directives) + "\n"
            + f"# Written by trtbuild{recipe}: {work} on {nodes} nodes x {processes} GPUs.\n"
            + "# The resume dir below, the interpreter and trtbuild's source must be at the same paths on\n"
            + "# every node (a shared filesystem; TRTBUILD_PYTHON / TRTBUILD_SRC override). After the job, run the same\n"
            + f"# `trtbuild build` again: the stage finds {result} and goes on.\n"
            + "set -euo pipefail\n"
            + default_assignment("TRTBUILD_PYTHON", sys.executable)
            + default_assignment("TRTBUILD_SRC", str(Path(__file__).resolve().parents[2]))
            + 'export PYTHONPATH="${TRTBUILD_SRC}${PYTHONPATH:+:$PYTHONPATH}"\n'
            + 'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            + f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n  "
            + " ".join(words) + "\n")


def launch(argv: list[str], resume: Path, steps: int, progress: Any, description: str,
           rendezvous_s: float | None = None, meeting: str = "",
           failure: str = "draft: distributed training failed") -> None:
    """Run the ranks; stream rank 0's progress (its fields besides `step` go to the bar); one clear line
    (BuildError) when any rank fails, or when `rendezvous_s` is given and the ranks have not started that
    long after the launch (the nodes did not meet at `meeting`, host:port)."""
    import threading

    from trtbuild.core.errors import BuildError

    for stale in resume.glob("error-rank*.txt"):
        stale.unlink()
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    log_path = resume / LAUNCH_LOG
    with open(log_path, "wb") as log, progress.task(description, steps) as bar:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, cwd=str(resume),
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        assert proc.stdout is not None
        joined, gave_up = threading.Event(), threading.Event()

        def give_up() -> None:
            if not joined.wait(rendezvous_s):
                gave_up.set()
                with contextlib.suppress(OSError):
                    proc.terminate()
                    proc.wait(timeout=10)
                with contextlib.suppress(OSError):
                    proc.kill()

        if rendezvous_s is not None:
            threading.Thread(target=give_up, daemon=True).start()
        done = None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(JOINED):
                joined.set()
            elif line.startswith(PROGRESS_PREFIX):
                fields = json.loads(line[len(PROGRESS_PREFIX):])
                if done is None:
                    bar.advance(fields["step"] - 1)
                    done = fields["step"] - 1
                bar.advance(fields["step"] - done, **{k: v for k, v in fields.items() if k != "step"})
                done = fields["step"]
            else:
                log.write(raw)
        code = proc.wait()
        joined.set()
    if gave_up.is_set():
        raise BuildError(f"draft: the training ranks did not start within {rendezvous_s:.0f} s of the launch: the "
                         f"nodes did not meet at {meeting or 'the rendezvous'} (another program may hold that port, "
                         "or a node did not start)", fix=f"set draft.train.slurm.rdzv_port to a free port; log: {log_path}")
    if code != 0:
        errors = sorted(resume.glob("error-rank*.txt"))
        said = errors[0].read_text(errors="replace").strip() if errors else _last_line(log_path)
        raise BuildError(f"{failure} (exit {code}): {said}",
                         fix=f"full log: {log_path}")


def _die_with_parent() -> None:
    """torchrun gets SIGTERM when the build process dies (kill -9 too) and stops its ranks, so no
    orphaned run keeps writing checkpoints beside the next build's (prctl PR_SET_PDEATHSIG = 1)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


_TELLING = ("Signal ", "exitcode", "Error:", "Error(", "Exception:", "error:")


def _last_line(path: Path) -> str:
    """The log's last line that says what failed (torchrun's exit summary, an exception), else its last line."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    telling = [line for line in lines if any(word in line for word in _TELLING)]
    return (telling or lines or ["no output"])[-1]


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


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def run_rank(job_file: Path) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file

    from trtbuild.core.cache import sha256_file
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
    job_file = Path(sys.argv[1])
    rank = os.environ.get("RANK", "0")
    try:
        run_rank(job_file)
    except BaseException as exc:  # one line for the stage, then the usual exit code for torchrun
        line = f"rank {rank}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        with contextlib.suppress(OSError):
            (job_file.parent / f"error-rank{rank}.txt").write_text(line + "\n")
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
