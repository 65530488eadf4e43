"""FP8 calibration in several processes: each rank holds an FSDP2 shard of the target, ModelOpt all-reduces.

With `quantize.calibration.processes x nodes > 1` the quantize stage launches ranks the way the draft
stage does (trtbuild/core/ranks.py, the draft stage's launch: torchrun on one node, srun inside a Slurm
allocation, an sbatch script otherwise). Every rank builds the target on the meta device, `fully_shard`s
each decoder layer over all ranks and reads only its rows of the
checkpoint (trtbuild/core/fsdp_shards.py), so no rank ever holds the whole model. It then runs
`mtq.quantize(model, cfg, forward_loop)` on its share of the calibration batches: ModelOpt's
`max_calibrate(distributed_sync=True)` all-reduces each quantizer's amax (max) over the data-parallel
group, which for Hugging Face modules is the whole world (modelopt/torch/quantization/model_calib.py
`max_calibrate`, nn/modules/quant_module.py, nvidia-modelopt 0.47.0), and weight amaxes are taken on
the all-gathered weights (utils/core_utils.py `fsdp2_weight_access_and_writeback_context`).

The batches are the one-process run's batches (same windows, same batch size), dealt round-robin; a
rank with one batch fewer repeats its own first batch, which cannot change a max. So the amaxes are
the one-process amaxes exactly. Rank 0 writes them (safetensors, then a JSON naming their sha256) into
the resume dir; the stage reads them back, applies them to its own model and runs the gate, the export
and the export check once, as in one process. A finished calibration is kept until the stage
succeeds: a build killed after it does not calibrate again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtbuild.core import ranks as launcher
from trtbuild.core.cache import default_root, sha256_file
from trtbuild.core.code_version import code_version
from trtbuild.core.errors import BuildError, UserError
from trtbuild.core.ranks import PROGRESS_PREFIX, atomic_write, read_verified
from trtbuild.quantize import modelopt_fp8

JOB_FILE = "calibrate.json"
WINDOWS_FILE = "windows.safetensors"
AMAX_FILE = "amax.safetensors"
RESULT_FILE = "amax.json"
MODULE = "trtbuild.quantize.distributed"


@dataclass
class CalibrationJob:
    """Everything a rank needs, as plain JSON."""

    model_dir: str
    resume_dir: str
    kv_cache: bool
    excluded: list[str]
    batch_size: int
    dtype: str  # float32 (CPU, as the one-process stage) or the checkpoint's dtype ("auto" on CUDA)
    device: str  # cpu | cuda
    backend: str  # gloo | nccl


def resume_dir(config: Any, model_key: str, data_key: Any = None) -> Path:
    """Where the ranks' amaxes wait for the stage: keyed by what shapes them (the calibration settings,
    the data's fingerprint, the quantizer config, the model artifact, this code), not by how many ranks
    ran."""
    import hashlib

    shaping = config.model_dump(mode="json", include={"kv_cache": True, "exclude": True, "format": True,
                                                      "calibration": True})
    for launch_field in ("processes", "nodes", "backend", "slurm"):
        shaping["calibration"].pop(launch_field)
    code = [code_version(f"trtbuild.quantize.{m}") for m in ("distributed", "modelopt_fp8", "quantization")]
    digest = hashlib.sha256(json.dumps([shaping, model_key, data_key, code], sort_keys=True,
                                       default=str).encode()).hexdigest()
    return default_root() / "resume" / f"quantize-{digest[:16]}"


# FSDP2 all-gathers the next decoder layer while one runs (implicit forward prefetch), so a rank holds
# up to two whole layers beside its shards.
GATHERED_LAYERS = 2


def rank_memory(outside: int, layers: list[int], world: int, bytes_per_parameter: float = 2.0
                ) -> dict[str, float]:
    """Weight bytes one calibration rank holds: its shards of every decoder layer, the whole layers being
    all-gathered, and what stays whole on every rank (embeddings, final norm, lm_head; core/fsdp_shards.py)."""
    out = {"shards": bytes_per_parameter * sum(layers) / world,
           "gathered": bytes_per_parameter * GATHERED_LAYERS * max(layers, default=0),
           "replicated": bytes_per_parameter * outside}
    out["total"] = sum(out.values())
    return out


def rank_batches(batches: int, rank: int, world: int) -> list[int]:
    """Indices of the batches this rank runs: round-robin, padded with its own first batch to the longest
    share, so every rank makes the same number of forwards (FSDP2 all-gathers in each one)."""
    mine = list(range(rank, batches, world))
    longest = -(-batches // world)
    if not mine:
        raise ValueError(f"{batches} calibration batches leave rank {rank} of {world} without one")
    return mine + [mine[0]] * (longest - len(mine))


def read_amaxes(resume: Path) -> dict[str, Any] | None:
    """The finished calibration's amaxes {quantizer name: tensor}, or None (none, or torn by a kill)."""
    found = read_verified(resume / AMAX_FILE, resume / RESULT_FILE)
    return None if found is None else found[1]


def calibrate_in_ranks(config: Any, model_dir: Path, windows: Any, excluded: list[str], dtype: str,
                       resume: Path, progress: Any, recipe_name: str = "") -> dict[str, Any]:
    """Launch the ranks over `windows` (the stage's calibration windows); returns the all-reduced amaxes."""
    from safetensors.torch import save_file

    cal = config.calibration
    done = read_amaxes(resume)
    if done is not None:
        progress.log(f"quantize: using the finished calibration in {resume}")
        return done
    resume.mkdir(parents=True, exist_ok=True)
    launcher.atomic_write(resume / WINDOWS_FILE, lambda tmp: save_file({"windows": windows.contiguous()}, str(tmp)))
    device = launcher.resolve_device("auto")
    job = CalibrationJob(model_dir=str(model_dir.resolve()), resume_dir=str(resume.resolve()),
                         kv_cache=config.kv_cache == "fp8", excluded=excluded, batch_size=cal.batch_size,
                         dtype=dtype, device=device, backend=launcher.resolve_backend(cal.backend, device))
    job_file = resume / JOB_FILE
    launcher.atomic_write(job_file, lambda tmp: tmp.write_text(json.dumps(asdict(job), indent=1)))
    if cal.nodes == 1:
        argv = launcher.torchrun_argv(job_file, cal.processes, module=MODULE)
    elif launcher.in_slurm_allocation(cal.nodes):
        argv = launcher.srun_argv(job_file, cal.processes, cal.nodes, launcher.slurm_head_node(),
                                  cal.slurm.rdzv_port, module=MODULE)
    else:
        script = resume / "calibrate.sbatch"
        script.write_text(launcher.slurm_script(job_file, cal.processes, cal.nodes, cal.slurm, recipe_name,
                                                module=MODULE, work="the quantize stage's FP8 calibration",
                                                result="the calibrated amaxes"))
        script.chmod(0o755)
        raise UserError(f"quantize.calibration.nodes {cal.nodes} needs a Slurm allocation of that many nodes; "
                        f"the job is prepared: sbatch {script}, then run the same build again",
                        field="quantize.calibration.nodes",
                        fix="submit the script (or run the build inside salloc/sbatch), or set nodes: 1")
    batches = -(-windows.shape[0] // cal.batch_size)
    what = (f"quantize: calibrating ({cal.processes} processes x {cal.nodes} nodes, {job.backend}, "
            "FSDP2-sharded target)")
    launcher.launch(argv, resume, -(-batches // cal.world_size()), progress, what,
                    failure="quantize: distributed calibration failed")
    amaxes = read_amaxes(resume)
    if amaxes is None:
        raise BuildError(f"quantize: the calibration processes exited without amaxes in {resume}",
                         fix=f"see {resume / launcher.LAUNCH_LOG}")
    return amaxes


def apply_amaxes(model: Any, cfg: dict[str, Any], amaxes: dict[str, Any]) -> None:
    """The stage's own model, quantized with the ranks' amaxes: `mtq.quantize` without a forward loop
    (quantizers inserted, weight amaxes taken), then every amax set to the ranks' value. A quantizer the
    ranks did not calibrate, or one they did that this model lacks, is an error (different models)."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.nn import TensorQuantizer

    with modelopt_fp8.quiet():
        mtq.quantize(model, cfg, None)
    quantizers = {name: module for name, module in model.named_modules()
                  if isinstance(module, TensorQuantizer) and module.is_enabled}
    uncalibrated = sorted(set(quantizers) - set(amaxes))
    unknown = sorted(set(amaxes) - set(quantizers))
    if uncalibrated or unknown:
        raise BuildError(f"quantize: the calibration ranks' amaxes do not fit the model (no amax for "
                         f"{uncalibrated[:3]}, amaxes of unknown quantizers {unknown[:3]})",
                         fix="remove the resume dir and build again")
    for name, quantizer in quantizers.items():
        amax = quantizer.amax
        device = amax.device if amax is not None else next(model.parameters()).device
        quantizer.amax = amaxes[name].to(device)


# ---------------------------------------------------------------- a rank's side


def meta_model(model_dir: Path) -> Any:
    """The model's modules with parameters on the meta device: names and config, no memory."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))


def sharded_model(model_dir: Path, dtype: Any, device: str) -> Any:
    """The target with every decoder layer FSDP2-sharded over all ranks, each rank reading only its rows."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from trtbuild.core.fsdp_shards import materialize, read_target_weights, shard_target

    config = AutoConfig.from_pretrained(str(model_dir))
    with init_empty_weights():  # parameters on meta, buffers (RoPE frequencies) real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    shard_target(model, torch.device(device).type)
    materialize(model, torch.device(device))
    model.tie_weights()
    read_target_weights(model, model_dir)
    return model


def quantizer_amaxes(model: Any) -> dict[str, Any]:
    """{name: amax} of every TensorQuantizer that has one (after calibration: equal on all ranks)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    out = {}
    for name, module in model.named_modules():
        amax = getattr(module, "amax", None) if isinstance(module, TensorQuantizer) else None
        if amax is not None:
            out[name] = amax.detach().float().cpu().contiguous()
    return out


def run_rank(job_file: Path) -> None:
    import datetime

    import modelopt.torch.quantization as mtq
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file

    job = CalibrationJob(**json.loads(job_file.read_text()))
    resume = Path(job.resume_dir)
    device = job.device
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    dist.init_process_group(job.backend, timeout=datetime.timedelta(minutes=60))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        dtype = getattr(torch, job.dtype) if job.dtype != "auto" else _checkpoint_torch_dtype(Path(job.model_dir))
        model = sharded_model(Path(job.model_dir), dtype, device)
        windows = load_file(str(resume / WINDOWS_FILE))["windows"]
        starts = list(range(0, windows.shape[0], job.batch_size))
        mine = rank_batches(len(starts), rank, world)

        def forward_loop(m: Any) -> None:
            with torch.no_grad():
                for done, index in enumerate(mine, 1):
                    start = starts[index]
                    m(input_ids=windows[start: start + job.batch_size].to(device), use_cache=False)
                    if rank == 0:
                        print(PROGRESS_PREFIX + json.dumps({"step": done}), flush=True)

        cfg = modelopt_fp8.quant_config(kv_cache=job.kv_cache, excluded=job.excluded)
        with modelopt_fp8.quiet():
            mtq.quantize(model, cfg, forward_loop)
        amaxes = quantizer_amaxes(model)
        if rank == 0:
            atomic_write(resume / AMAX_FILE, lambda tmp: save_file(amaxes, str(tmp)))
            record = {"world_size": world, "batches": len(starts), "quantizers": len(amaxes),
                      "sha256": sha256_file(resume / AMAX_FILE)}
            atomic_write(resume / RESULT_FILE, lambda tmp: tmp.write_text(json.dumps(record)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _checkpoint_torch_dtype(model_dir: Path) -> Any:
    """The dtype the one-process stage loads on CUDA ("auto"): the config's torch_dtype / dtype."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    found = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, found) if isinstance(found, str) else found


def main() -> None:
    launcher.rank_main(run_rank)


if __name__ == "__main__":
    main()
