"""FP8 calibration in two gloo ranks, launched by the quantize stage itself (torchrun, FSDP2 on CPU).

The reference is the one-process stage on the same trained tiny Llama and the same windows: its
exported FP8 scales (every `weight_scale`, `input_scale`, k/v scale) and FP8 weights must be equal to
the two-rank run's, bit for bit, since a max is exact whatever the split. The check can fail: a
one-process run on the first batch only (what one rank sees before ModelOpt's all-reduce) gives other
input scales, measured here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from trtbuild.core.cache import default_root as resume_root
from trtbuild.core.errors import UserError
from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Artifact, StageContext, StageResult
from trtbuild.quantize.config import QuantizeConfig
from trtbuild.quantize.distributed import rank_batches
from trtbuild.quantize.stage import QuantizeStage

# 3 batches over 2 ranks: rank 1 repeats its own batch to match rank 0's two forwards.
CONFIG = {"calibration": {"num_samples": 24, "seq_len": 64, "batch_size": 8},
          "gate": {"seq_len": 64, "eval_samples": 8, "max_perplexity_ratio": 2.0}}


class Said(Progress):
    """The stage's status lines, kept."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def run_stage(model_root: Path, out: Path, progress: Progress | None = None, **calibration: Any) -> StageResult:
    out.mkdir(parents=True)
    config = json.loads(json.dumps(CONFIG))
    config["calibration"].update(calibration)
    ctx = StageContext(recipe=RecipeInfo.standalone(), inputs={"model": Artifact("model", "tiny-key", model_root)},
                       out_dir=out, progress=progress or Progress())
    return QuantizeStage().run(QuantizeConfig.model_validate(config), ctx)


def scales(out: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted((out / "hf").glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quantize_fixtures import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model"))


def test_rank_batches_cover_every_batch_with_equal_forwards() -> None:
    for batches in range(2, 12):
        for world in range(1, batches + 1):
            shares = [rank_batches(batches, r, world) for r in range(world)]
            assert {b for share in shares for b in share} == set(range(batches))
            assert len({len(share) for share in shares}) == 1
            assert all(set(share) <= set(range(r, batches, world)) for r, share in enumerate(shares))


def test_fewer_batches_than_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match="do not give each"):
        QuantizeConfig.model_validate({"calibration": {"num_samples": 8, "batch_size": 8, "processes": 2}})


@pytest.mark.slow
def test_two_gloo_ranks_export_the_one_process_scales(model_root: Path, tmp_path: Path) -> None:
    one = run_stage(model_root, tmp_path / "one")
    two = run_stage(model_root, tmp_path / "two", processes=2, backend="gloo")
    run_stage(model_root, tmp_path / "first", num_samples=8)
    assert two.metrics["calibration_processes"] == 2 and one.metrics["calibration_processes"] == 1
    ref, got, part = scales(tmp_path / "one"), scales(tmp_path / "two"), scales(tmp_path / "first")
    scale_names = [n for n in ref if n.endswith(("weight_scale", "input_scale", "k_scale", "v_scale"))]
    assert any(n.endswith("input_scale") for n in scale_names)
    assert any(n.endswith("weight_scale") for n in scale_names)
    assert set(got) == set(ref)
    for name, tensor in ref.items():  # scales and the FP8 weights they produced, bit for bit
        assert got[name].dtype == tensor.dtype and torch.equal(got[name].reshape(-1).view(torch.uint8),
                                                               tensor.reshape(-1).view(torch.uint8)), name
    # the check can fail: one rank's batches alone give other activation scales
    differ = [n for n in scale_names if n.endswith("input_scale") and not torch.equal(part[n], ref[n])]
    assert differ, "the first batch alone gave the same input scales: the test cannot tell a missing all-reduce"
    assert two.metrics["perplexity_quantized"] == one.metrics["perplexity_quantized"]
    assert two.metrics["export_layer_error_max"] == one.metrics["export_layer_error_max"]
    # the finished calibration's resume dir is gone once the stage succeeded
    assert not list((resume_root() / "resume").glob("quantize-*"))


def test_several_nodes_outside_slurm_write_the_sbatch_script(model_root: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(UserError, match="sbatch") as raised:
        run_stage(model_root, tmp_path / "out", processes=1, nodes=2)
    script = Path(str(raised.value).split("sbatch ")[1].split(",")[0])
    text = script.read_text()
    assert "-m trtbuild.quantize.distributed" in text and "--nnodes=2" in text and "--nproc-per-node=1" in text
    assert "#SBATCH -J trtbuild-quantize" in text
    assert not (tmp_path / "out" / "hf").exists()


@pytest.mark.slow
def test_a_finished_calibration_is_not_run_again(model_root: Path, tmp_path: Path) -> None:
    """The gate fails after the ranks calibrated: the amaxes stay in the resume dir, and the next build
    (another gate: not part of what shapes the amaxes) uses them without launching ranks."""
    from trtbuild.core.errors import BuildError

    strict = {**CONFIG, "calibration": {**CONFIG["calibration"], "processes": 2}, "gate": {**CONFIG["gate"],
                                                                                           "max_perplexity_ratio": 0.5}}
    config = QuantizeConfig.model_validate(strict)
    ctx = StageContext(recipe=RecipeInfo.standalone(), inputs={"model": Artifact("model", "tiny-key", model_root)},
                       out_dir=tmp_path / "strict")
    (tmp_path / "strict").mkdir()
    with pytest.raises(BuildError, match="gate failed"):
        QuantizeStage().run(config, ctx)
    (resume,) = (resume_root() / "resume").glob("quantize-*")
    assert (resume / "amax.safetensors").is_file() and (resume / "launch.log").is_file()
    (resume / "launch.log").unlink()  # the launcher writes it whenever it runs ranks
    said = Said()
    result = run_stage(model_root, tmp_path / "again", said, processes=2)
    assert any("using the finished calibration" in line for line in said.lines), said.lines
    assert result.metrics["calibration_processes"] == 2
    assert not resume.exists()  # removed once the stage succeeded (launch.log never came back)


def test_a_failing_rank_is_one_clear_line(model_root: Path, tmp_path: Path) -> None:
    """A rank that dies (here: the checkpoint lacks the final norm, which every rank reads) fails the stage
    with one line naming the rank and the error; nothing is exported."""
    import shutil

    from safetensors.torch import save_file

    from trtbuild.core.errors import BuildError

    broken = tmp_path / "broken"
    shutil.copytree(model_root, broken)
    (file,) = (broken / "hf").glob("*.safetensors")
    tensors = load_file(file)
    del tensors["model.norm.weight"]
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(BuildError) as failed:
        run_stage(broken, tmp_path / "out", processes=2, backend="gloo")
    line = str(failed.value)
    assert "distributed calibration failed" in line and ("rank 0" in line or "rank 1" in line)
    assert "model.norm.weight" in line and "\n" not in line
    assert not (tmp_path / "out" / "hf").exists()
