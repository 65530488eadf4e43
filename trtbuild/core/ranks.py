"""Ranks a stage launches itself: torchrun on one node, srun inside a Slurm allocation, an sbatch script
otherwise; their progress and one-line failures; files a rank hands back to the stage.

The draft stage's training (trtbuild/draft/distributed.py) and the quantize stage's calibration
(trtbuild/quantize/distributed.py) launch their ranks with these. A rank module is run as `python -m
<module> <job.json>`; rank 0 reports progress as `TRTBUILD_PROGRESS {json}` lines on stdout (a `step`
and any fields for the bar); a failing rank writes one line (`error-rank<N>.txt`) beside the job file.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.cache import sha256_file
from trtbuild.core.errors import BuildError
from trtbuild.core.shell import comment_safe, default_assignment, quote, sbatch_directives

if TYPE_CHECKING:
    import torch

LAUNCH_LOG = "launch.log"


PROGRESS_PREFIX = "TRTBUILD_PROGRESS "
JOINED = "TRTBUILD_RANKS_JOINED"  # rank 0's first line: torchrun started the ranks, so the nodes met


def resolve_device(device: str) -> str:
    """auto: cuda when torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_backend(backend: str, device: str) -> str:
    return backend if backend != "auto" else ("nccl" if device == "cuda" else "gloo")


def torchrun_argv(job_file: Path, processes: int, nodes: int = 1, rdzv_endpoint: str | None = None, *,
                  module: str) -> list[str]:
    """torchrun for one node (--standalone: a local rendezvous on a free port) or one node of several;
    each rank runs `python -m <module> <job_file>`."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}", "--max-restarts=0"]
    if nodes == 1:
        launcher.append("--standalone")
    else:
        launcher += [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                     f"--rdzv-id=trtbuild-{module.split('.')[1]}"]
    return [*launcher, "-m", module, str(job_file)]


def srun_argv(job_file: Path, processes: int, nodes: int, head: str, port: int, *, module: str) -> list[str]:
    """One torchrun per node under srun, meeting at the allocation's first node."""
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            *torchrun_argv(job_file, processes, nodes, f"{head}:{port}", module=module)]


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


def slurm_script(job_file: Path, processes: int, nodes: int, slurm: Any, recipe_name: str = "", *, module: str,
                 work: str, result: str) -> str:
    """sbatch script: one torchrun per node (srun), c10d rendezvous on the first node of the allocation."""
    directives = sbatch_directives(job_name=slurm.job_name, nodes=nodes, tasks_per_node=1,
                                   gpus_per_node=processes, time_limit=slurm.time_limit,
                                   output=f"{slurm.job_name}-%j.out", partition=slurm.partition, account=slurm.account)
    recipe = f" for recipe '{comment_safe(recipe_name)}'" if recipe_name else ""
    endpoint = f'--rdzv-endpoint="${{HEAD}}:{slurm.rdzv_port}"'  # HEAD: set by the script itself
    words = ['"${TRTBUILD_PYTHON}"'] + [endpoint if a.startswith("--rdzv-endpoint=") else quote(a)
                                        for a in torchrun_argv(job_file, processes, nodes, "HEAD", module=module)[1:]]
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
           failure: str = "distributed run failed", rendezvous_s: float | None = None, meeting: str = "",
           rendezvous_field: str = "the rendezvous port") -> None:
    """Run the ranks; stream rank 0's progress (its fields besides `step` go to the bar); one clear line
    (BuildError) when any rank fails, or when `rendezvous_s` is given and the ranks have not started that
    long after the launch (the nodes did not meet at `meeting`, host:port; rank 0 prints JOINED first)."""
    import threading

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
        raise BuildError(f"{description}: the ranks did not start within {rendezvous_s:.0f} s of the launch: the "
                         f"nodes did not meet at {meeting or 'the rendezvous'} (another program may hold that port, "
                         "or a node did not start)", fix=f"set {rendezvous_field} to a free port; log: {log_path}")
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


def atomic_write(path: Path, write: Any) -> None:
    """`write(tmp)`, then the temp file renamed over `path` (a kill leaves the old file or none)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)



def read_verified(tensor_file: Path, meta_file: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """(meta, tensors) of a pair written tensors first, then the JSON naming their sha256; None when
    either is missing or unreadable, or they do not match (a kill between the two writes)."""
    from safetensors.torch import load_file

    if not (tensor_file.is_file() and meta_file.is_file()):
        return None
    try:
        meta = json.loads(meta_file.read_text())
        if meta.get("sha256") != sha256_file(tensor_file):
            return None
        return meta, load_file(str(tensor_file))
    except (OSError, ValueError):
        return None


def rank_main(run_rank: Callable[[Path], None]) -> None:
    """A rank's entry point (`python -m <module> JOB_FILE` under torchrun): run it; on any failure write
    one line `error-rank<N>.txt` beside the job file for the stage (`launch` reports it) and exit 1, the
    code torchrun expects."""
    job_file = Path(sys.argv[1])
    rank = os.environ.get("RANK", "0")
    try:
        run_rank(job_file)
    except BaseException as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        line = f"rank {rank}: {type(exc).__name__}: {said}"
        with contextlib.suppress(OSError):
            (job_file.parent / f"error-rank{rank}.txt").write_text(line + "\n")
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)
