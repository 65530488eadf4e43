"""Draft training in two processes, launched by the draft stage itself (torchrun, gloo, DDP).

Two ranks each train on half of every global batch; DDP averages the draft's gradients, so the run
is the one-process run up to float32 summation order. The tolerance is not typed in: it is measured
in the same test as the gap between two ONE-process runs that differ only in summation order (the
whole batch in one forward vs two half-batch forwards with gradient accumulation,
`draft.train.micro_batch_size`), over two seeds. The two-process curve must stay within a small
multiple of that gap, while a different batch order (another seed) moves the curve far more,
so the check can fail. tau of the two-process draft must lie inside the one-process seed spread.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.draft.stage import DraftConfig, DraftStage, resume_dir

# A briefly trained tiny target (predictable enough for a short draft training to reach tau > 1).
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "seq_len": 64, "batch_size": 8, "steps": 40,
        "warmup_steps": 4, "processes": 1}
DRAFT = dict(samples=32, steps=16, batch_size=8, seq_len=32, prompt_len=8, max_draft_len=3, lr=3e-3,
             checkpoint_every=4, eval={"prompts": 8, "prompt_len": 12, "new_tokens": 32})
SEEDS = (0, 1, 2)
NOISE_SEEDS = (0, 1)
MARGIN = 4.0  # the two-process gap may be this many times the measured summation-order gap



def _Recipe(base_dir: Path) -> RecipeInfo:
    return RecipeInfo.standalone(base_dir)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    from trtbuild.model.tiny import TinyModelConfig, build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_model(TinyModelConfig(**TINY), root / "hf", Progress())
    return Artifact("model", "tiny-key", root)


def run_stage(target: Artifact, out: Path, seed: int, draft: dict[str, Any] | None = None,
              **train: Any) -> tuple[list[float], float, dict[str, Any]]:
    """(per-step losses, tau, metrics) of one draft stage run; `draft`: other draft fields."""
    out.mkdir(parents=True)
    config = DraftConfig(**{**DRAFT, **(draft or {}), "seed": seed, "train": train})
    ctx = StageContext(recipe=_Recipe(out.parent), inputs={"model": target}, out_dir=out, progress=Progress())
    result = DraftStage().run(config, ctx)
    losses = json.loads((out / "train_log.json").read_text())["losses"]
    return losses, result.metrics["acceptance_length"], result.metrics


def max_rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_two_processes_train_like_one(tiny_target: Artifact, tmp_path: Path) -> None:
    one = {s: run_stage(tiny_target, tmp_path / f"one{s}", s) for s in SEEDS}
    noise = max(max_rel_diff(run_stage(tiny_target, tmp_path / f"acc{s}", s, micro_batch_size=4)[0], one[s][0])
                for s in NOISE_SEEDS)
    two = {s: run_stage(tiny_target, tmp_path / f"two{s}", s, processes=2) for s in NOISE_SEEDS}

    assert all(m["train_processes"] == 2 for _, _, m in two.values())
    gaps = [max_rel_diff(two[s][0], one[s][0]) for s in NOISE_SEEDS]
    other_order = max_rel_diff(one[1][0], one[0][0])  # what a wrong sharding or batch would look like
    print(f"\nsummation-order gap {noise:.2e}, two-process gaps {[f'{g:.2e}' for g in gaps]}, "
          f"other seed {other_order:.2e}; tau one {[round(one[s][1], 3) for s in SEEDS]}, "
          f"two {[round(two[s][1], 3) for s in NOISE_SEEDS]}")
    assert noise > 0  # the reference really measured a different summation order
    assert max(gaps) <= MARGIN * noise
    assert other_order > 100 * MARGIN * noise  # a wrong batch would not pass
    taus = [one[s][1] for s in SEEDS]
    assert max(taus) > 1.0  # the draft learned something, so tau can tell runs apart
    for s in NOISE_SEEDS:
        assert min(taus) <= two[s][1] <= max(taus)


def test_a_failing_rank_is_one_clear_line(tiny_target: Artifact, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A rank that dies (here: the job names a target that is not there) fails the stage with one line
    naming the rank and the error, and leaves nothing in the artifact directory."""
    from trtbuild.core.errors import BuildError
    from trtbuild.draft import distributed

    real = distributed.write_job

    def broken_job(job: Any, model: Any) -> Path:
        job.target_dir = str(tmp_path / "gone")
        return real(job, model)

    monkeypatch.setattr(distributed, "write_job", broken_job)
    out = tmp_path / "out"
    with pytest.raises(BuildError) as failed:
        run_stage(tiny_target, out, 0, processes=2)
    line = failed.value.one_line()
    assert "rank 0" in line or "rank 1" in line
    assert "gone" in line and "\n" not in str(failed.value)
    assert not (out / "eagle3").exists() and not (out / "train_log.json").exists()


KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_draft_distributed import run_stage
from trtbuild.core.stage import Artifact
run_stage(Artifact("model", "tiny-key", Path({target!r})), Path({out!r}), 0, processes=2)
"""


def _processes_naming(path: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_two_processes_train_offline_like_one(tiny_target: Artifact, tmp_path: Path) -> None:
    """hidden_states: offline under DDP: each rank reads the hidden-state shards with a head-only
    target. The two-process curve is one process's up to summation order (half-batch accumulation)."""
    offline = {"hidden_states": "offline"}
    one, tau_one, m_one = run_stage(tiny_target, tmp_path / "one", 0, offline)
    noise = max_rel_diff(run_stage(tiny_target, tmp_path / "acc", 0, offline, micro_batch_size=4)[0], one)
    two, tau_two, m_two = run_stage(tiny_target, tmp_path / "two", 0, offline, processes=2)
    assert m_two["train_processes"] == 2
    assert m_two["hidden_states_bytes"] == m_one["hidden_states_bytes"] > 0  # the same shard set, reused
    assert noise > 0 and max_rel_diff(two, one) <= MARGIN * noise
    assert abs(tau_two - tau_one) <= 0.05 * tau_one  # weights equal to 1e-7: only a rare argmax flip may differ


@pytest.mark.slow
def test_two_processes_with_the_target_sharded_train_like_one(tiny_target: Artifact, tmp_path: Path) -> None:
    """train.target_sharding: fsdp: FSDP2 (over gloo) gives each rank half of every target decoder layer,
    all-gathered layer by layer in the forward; the curve is one process's up to summation order. Each
    rank builds the target on the meta device and reads only its rows of the layers from disk."""
    from safetensors.torch import load_file

    one, tau_one, _ = run_stage(tiny_target, tmp_path / "one", 0)
    noise = max_rel_diff(run_stage(tiny_target, tmp_path / "acc", 0, micro_batch_size=4)[0], one)
    two, tau_two, metrics = run_stage(tiny_target, tmp_path / "two", 0, processes=2, target_sharding="fsdp")
    assert metrics["train_target_sharding"] == "fsdp" and metrics["train_processes"] == 2
    whole, held = metrics["target_layer_parameters"], metrics["target_layer_parameters_per_rank"]
    assert whole > 0 and held * 2 == whole
    # rank 0 read the first half (torch.chunk's split) of every layer tensor's rows and the rest whole
    checkpoint = load_file(str(tiny_target.path / "hf" / "model.safetensors"))
    share = {n: -(-t.shape[0] // 2) / t.shape[0] if ".layers." in n else 1.0 for n, t in checkpoint.items()}
    expected = sum(int(t.numel() * share[n]) * t.element_size() for n, t in checkpoint.items())
    assert metrics["target_bytes_read_per_rank"] == expected
    assert expected < 0.8 * sum(t.numel() * t.element_size() for t in checkpoint.values())
    assert noise > 0 and max_rel_diff(two, one) <= MARGIN * noise
    assert abs(tau_two - tau_one) <= 0.05 * tau_one


@pytest.mark.slow
def test_two_process_training_resumes_after_kill_9(tiny_target: Artifact, tmp_path: Path) -> None:
    """kill -9 of the build process mid-training: torchrun and its ranks stop with it (parent-death
    signal), the next run resumes from rank 0's checkpoint and ends on the same loss curve as an
    uninterrupted two-process run."""
    config = DraftConfig(**{**DRAFT, "seed": 0, "train": {"processes": 2}})
    resume = resume_dir(config, tiny_target.key)
    script = KILL_SCRIPT.format(tests=str(Path(__file__).parent), target=str(tiny_target.path),
                                out=str(tmp_path / "killed"))
    proc = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (resume / "state.json").is_file():  # the first checkpoint (step 4 of 16)
        assert proc.poll() is None and time.monotonic() < deadline, "training ended before a checkpoint"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # the build process only: its torchrun must stop the ranks itself
    proc.wait()
    try:
        while _processes_naming(resume):  # torchrun and both ranks name the job file in the resume dir
            assert time.monotonic() < deadline, "the ranks outlived the killed build"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group, should the check fail
    checkpointed = json.loads((resume / "state.json").read_text())["step"]
    assert 0 < checkpointed < DRAFT["steps"]

    losses, _, metrics = run_stage(tiny_target, tmp_path / "resumed", 0, processes=2)
    log = json.loads((tmp_path / "resumed" / "train_log.json").read_text())
    assert log["resumed_from_step"] >= checkpointed and metrics["train_steps"] == DRAFT["steps"]
    fresh, _, _ = run_stage(tiny_target, tmp_path / "fresh", 0, processes=2)
    assert len(losses) == len(fresh) == DRAFT["steps"]
    # Resuming restores weights and optimizer state bit for bit (safetensors; losses through JSON, which
    # round-trips floats), and gloo's two-rank sum is deterministic: the curves are equal.
    assert losses == fresh


# Stand-ins for Slurm's srun and scontrol on one machine: srun starts its command once per node
# (here all on localhost, so torchrun's c10d rendezvous meets on this host); scontrol names the
# allocation's only host. Everything after srun's own options is the real torchrun command.
FAKE_SRUN = """#!/bin/bash
nodes=1
while [[ "$1" == --* ]]; do case "$1" in --nodes=*) nodes="${1#--nodes=}";; esac; shift; done
pids=()
for i in $(seq 1 "$nodes"); do SLURM_NODEID=$((i - 1)) "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit "$rc"
"""
FAKE_SCONTROL = '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && echo localhost\n'


def _slurm_standins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_several_nodes_under_slurm(tiny_target: Artifact, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """nodes: 2 (x 1 process). Outside an allocation the stage prepares the job, writes the sbatch
    script and stops with one line naming it; the script (srun + torchrun, c10d rendezvous) trains and
    the same build then exports that draft. Inside an allocation (a fresh cache) the stage runs srun +
    torchrun itself. Both launches train the same ranks on the same shards: equal loss curves."""
    from trtbuild.core.errors import BuildError, UserError

    for name in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    train = {"processes": 1, "nodes": 2, "slurm": {"rdzv_port": _free_port(), "partition": "gpu"}}
    with pytest.raises(UserError) as stopped:
        run_stage(tiny_target, tmp_path / "first", 0, **train)
    line = stopped.value.one_line()
    assert line.startswith("draft.train.nodes:") and "sbatch " in line
    script = Path(line.split("sbatch ", 1)[1].split(",", 1)[0])
    text = script.read_text()
    assert "#SBATCH -N 2" in text and "#SBATCH -p gpu" in text and "srun --nodes=2" in text
    assert "--rdzv-backend=c10d" in text and "--nnodes=2" in text and "--nproc-per-node=1" in text
    assert not (tmp_path / "first" / "eagle3").exists()

    bin_dir = _slurm_standins(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "localhost"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    by_script, tau, metrics = run_stage(tiny_target, tmp_path / "second", 0, **train)
    assert metrics["train_processes"] == 2 and len(by_script) == DRAFT["steps"]
    assert 1.0 <= tau <= 1 + DRAFT["max_draft_len"]

    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "cache-in-allocation"))  # no trained job to find
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    train["slurm"]["rdzv_port"] = _free_port()
    try:
        by_stage, _, metrics = run_stage(tiny_target, tmp_path / "inside", 0, **train)
    except BuildError as exc:  # show the launcher's log: the one line names it
        log = Path(str(exc.fix).removeprefix("full log: "))
        pytest.fail(f"{exc.one_line()}\n{log.read_text(errors='replace')[-4000:] if log.is_file() else ''}")
    assert metrics["train_processes"] == 2 and by_stage == by_script


def test_a_held_rendezvous_port_inside_an_allocation_is_one_line(tiny_target: Artifact, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                 monkeypatch) -> None:
    """Issue 38 finding 5: another program listening on rdzv_port of the first node (this one): the
    build printed nothing and hung; now one line names the field before anything is launched."""
    import socket

    from trtbuild.core.errors import UserError

    bin_dir = _slurm_standins(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen(1)
        port = held.getsockname()[1]
        with pytest.raises(UserError) as stopped:
            run_stage(tiny_target, tmp_path / "held", 0, processes=1, nodes=2, slurm={"rdzv_port": port})
    line = stopped.value.one_line()
    assert line.startswith("draft.train.slurm.rdzv_port:") and f"port {port}" in line, line
    assert len(line.splitlines()) == 1
