"""Issue 37.6: the draft preflight sizes the training batch per rank, against one GPU on CUDA.

draft.batch_size is the global batch: each of draft.train.world_size() ranks holds its shard (or
draft.train.micro_batch_size of it) per forward. On CUDA that is held in the GPU's memory, not the host's.
The machine's and the GPU's memory are set here, so the cases do not depend on the host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtbuild.app import crosschecks
from trtbuild.app.recipe import load_recipe

GIB = 1 << 30


def _recipe(tmp_path: Path, train: str, batch: int = 512, seq: int = 2048):  # type: ignore[no-untyped-def]
    (tmp_path / "r.yaml").write_text(
        "name: t\nmodel: {source: tiny}\n"
        f"draft: {{max_draft_len: 3, source: train, batch_size: {batch}, seq_len: {seq}, train: {train}}}\n")
    return load_recipe(tmp_path / "r.yaml")


def _need(recipe, rows: int) -> float:  # type: ignore[no-untyped-def]
    """Independent arithmetic: logits (fp32, 3 copies, per unroll step) and 12 hidden-sized fp32 buffers."""
    shapes = crosschecks._target_shapes(recipe)
    draft = recipe.draft
    vocab = draft.draft_vocab_size or shapes["vocab_size"]
    return rows * draft.seq_len * (vocab * 4 * 3 * draft.ttt_steps + shapes["hidden_size"] * 4 * 12)


def _draft_lines(recipe) -> list[str]:  # type: ignore[no-untyped-def]
    return [line for line in crosschecks._memory(recipe, crosschecks._target_shapes(recipe))
            if "draft logits" in line]


@pytest.mark.parametrize(("processes", "gpu_gib", "refused"), [(1, 80, True), (8, 80, False), (8, 4, True)])
def test_cuda_training_is_sized_per_rank_against_one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         processes: int, gpu_gib: int, refused: bool) -> None:
    monkeypatch.setattr(crosschecks, "machine_memory", lambda: 2048 * GIB)  # the host is never the limit
    monkeypatch.setattr(crosschecks, "gpu_memory", lambda: gpu_gib * GIB)
    recipe = _recipe(tmp_path, f"{{processes: {processes}, device: cuda}}")
    need = _need(recipe, -(-512 // processes))
    assert (need > gpu_gib * GIB) is refused  # the cases straddle the limit by the arithmetic above
    lines = _draft_lines(recipe)
    assert len(lines) == int(refused)
    if refused:
        assert lines[0].startswith("draft.batch_size: needs about")
        assert f"{-(-512 // processes)} x 2048 tokens" in lines[0] and f"over {processes} rank" in lines[0]
        assert f"more than one GPU's {gpu_gib}.0 GiB" in lines[0]


def test_micro_batch_is_what_one_forward_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crosschecks, "machine_memory", lambda: 2048 * GIB)
    monkeypatch.setattr(crosschecks, "gpu_memory", lambda: 80 * GIB)
    whole = _recipe(tmp_path, "{processes: 1, device: cuda}")
    assert _need(whole, 512) > 80 * GIB and _draft_lines(whole)
    micro = _recipe(tmp_path, "{processes: 1, device: cuda, micro_batch_size: 4}")
    assert _need(micro, 4) < 80 * GIB and _draft_lines(micro) == []


def test_cpu_training_is_sized_against_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crosschecks, "gpu_memory", lambda: 80 * GIB)  # ignored on the CPU
    recipe = _recipe(tmp_path, "{processes: 2, device: cpu}")
    need = _need(recipe, 256)
    monkeypatch.setattr(crosschecks, "machine_memory", lambda: int(need * 2))
    assert _draft_lines(recipe) == []
    monkeypatch.setattr(crosschecks, "machine_memory", lambda: int(need / 2))
    (line,) = _draft_lines(recipe)
    assert "256 x 2048 tokens" in line and "this machine's" in line


def test_a_gpu_this_host_lacks_is_not_judged_by_host_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crosschecks, "machine_memory", lambda: 1 * GIB)
    monkeypatch.setattr(crosschecks, "gpu_memory", lambda: None)
    assert _draft_lines(_recipe(tmp_path, "{processes: 1, device: cuda}")) == []
