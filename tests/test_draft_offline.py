"""Offline EAGLE-3 training (`draft.hidden_states: offline`): the stored hidden states are what ModelOpt's
online forward computes (same loss), the dump resumes after kill -9 keeping its finished shards,
another lr reuses the shards (plan says so, the stage does not recompute them), and plan's disk
estimate matches the files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from draft_fixtures import write_target

from trtbuild.core.progress import Progress
from trtbuild.draft import shards

AUX = [0, 2]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("target") / "hf")


@pytest.mark.trtllm11  # ModelOpt 0.37 too (it keeps one decoder layer: modelopt_compat.offline_base_layers)
def test_head_only_target_holds_the_embeddings_norm_and_lm_head(target: Path) -> None:
    from trtbuild.draft.hidden_store import load_head_only
    from trtbuild.draft.model import load_target

    full, head = load_target(target), load_head_only(target)
    from trtbuild.draft.modelopt_compat import offline_base_layers

    names = {name for name, _ in head.named_parameters()}
    kept = {name.split(".layers.")[1].split(".")[0] for name in names if ".layers." in name}
    assert kept == {str(i) for i in range(offline_base_layers())}, names
    full_params = dict(full.named_parameters())
    for name, param in head.named_parameters():
        assert torch.equal(param, full_params[name]), name


@pytest.mark.trtllm11
def test_offline_inputs_give_the_online_loss(target: Path) -> None:
    """One ModelOpt forward on the same batch and the same draft weights: online (the target runs)
    and offline (the captured tensors, head-only target) agree on the loss and the accuracies."""
    from trtbuild.draft.hidden import capture
    from trtbuild.draft.hidden_store import load_head_only
    from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target

    batch = torch.randint(3, 384, (3, 24), generator=torch.Generator().manual_seed(0))
    arch = DraftArch(aux_layers=AUX, draft_vocab_size=384)
    torch.manual_seed(0)
    online = convert_to_eagle3(load_target(target), arch, None)
    stored = capture(load_target(target), batch, AUX)
    torch.manual_seed(0)
    offline = convert_to_eagle3(load_head_only(target), DraftArch(**{**arch.__dict__, "offline": True}), None)
    assert torch.equal(next(online.eagle_module.parameters()), next(offline.eagle_module.parameters()))
    online.train()
    offline.train()
    a = online(input_ids=batch)
    b = offline(input_ids=batch, base_model_outputs=stored)
    assert torch.allclose(a.loss, b.loss, rtol=1e-5, atol=1e-6), (a.loss, b.loss)
    assert torch.allclose(torch.as_tensor(a.train_acc), torch.as_tensor(b.train_acc))


_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import trtbuild.draft.hidden as hidden
    from trtbuild.draft.draft_data import ShardSet
    from trtbuild.core.progress import Progress

    write = hidden.write_dump_shard
    def slow_write(*args, **kwargs):  # slow the dump down so the parent can kill it in the middle
        path = write(*args, **kwargs)
        time.sleep(0.4)
        return path
    hidden.write_dump_shard = slow_write
    data = ShardSet(Path(sys.argv[1]), sys.argv[2], False, 0, 0, 0.0)
    hidden.ensure_hidden(data, Path(sys.argv[3]), [0, 2], "float32", Progress())
""")


def _stamps(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.glob("shard-*.safetensors")}


def test_kill_during_the_dump_keeps_finished_shards(target: Path, isolated_cache: Path) -> None:
    from safetensors.torch import load_file

    from trtbuild.core.layout import DRAFT_HIDDEN
    from trtbuild.draft.config import DraftConfig
    from trtbuild.draft.draft_data import ensure_data
    from trtbuild.draft.hidden import capture, ensure_hidden, hidden_key
    from trtbuild.draft.model import load_target

    config = DraftConfig(samples=24, seq_len=16, prompt_len=4, shard_samples=3)  # 8 shards
    data = ensure_data(config, target, "target-key", None, Progress())
    work = shards.resume_dir(DRAFT_HIDDEN, hidden_key(data.key, AUX, "float32"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get(
        "PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(data.path), data.key, str(target)], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(work.glob("shard-*.safetensors"))) < 2:
            assert child.poll() is None, "the dump ended before it could be killed"
            assert time.monotonic() < deadline, "the dump wrote no shards"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    kept = _stamps(work)
    assert 2 <= len(kept) < 8

    resumed = ensure_hidden(data, target, AUX, "float32", Progress())
    assert (resumed.kept, resumed.computed) == (len(kept), 8 - len(kept))
    after = _stamps(resumed.path)
    assert len(after) == 8
    assert {name: after[name] for name in kept} == kept, "a finished shard was written again"
    assert not work.exists()
    # the resumed set holds what an uninterrupted capture computes, row for row
    model = load_target(target)
    for index in range(8):
        shard = load_file(str(resumed.path / shards.shard_name(index)))
        expected = capture(model, shard["input_ids"], AUX)
        assert torch.allclose(shard["aux_hidden_states"], expected["aux_hidden_states"], atol=1e-5)
        assert torch.allclose(shard["base_model_hidden_states"], expected["base_model_hidden_states"], atol=1e-5)


def _plan(capsys: pytest.CaptureFixture[str], recipe: Path, *overrides: str) -> dict:
    import json

    from trtbuild.cli import main

    main(["plan", str(recipe), *overrides, "--json"])
    return json.loads(capsys.readouterr().out)


def _hidden_note(report: dict) -> str:
    notes = [n for n in report["notes"] if n.startswith("draft hidden states")]
    assert len(notes) == 1, report["notes"]
    return notes[0]


def test_another_lr_reuses_the_shards_and_plan_says_so(target: Path, tmp_path: Path, isolated_cache: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import re

    from trtbuild.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: offline\noutput_dir: out\nmodel:\n  source: path\n  path: {target}\n"
                      "draft:\n  hidden_states: offline\n  samples: 20\n  seq_len: 24\n  prompt_len: 6\n"
                      "  shard_samples: 8\n  steps: 2\n  batch_size: 4\n  aux_layers: [0, 2]\n"
                      "  eval: {prompts: 0}\n")
    before = _hidden_note(_plan(capsys, recipe))
    assert "will be computed" in before
    match = re.search(r"= ([\d.]+) (B|KiB|MiB|GiB) on disk", before)
    assert match, before
    estimate = float(match.group(1)) * {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[match.group(2)]

    main(["build", str(recipe), "--json"])
    first = json.loads(capsys.readouterr().out)
    draft = next(s for s in first["stages"] if s["name"] == "draft")
    assert draft["status"] == "ran"
    entries = list((isolated_cache / "draft-hidden").iterdir())
    entries = [e for e in entries if not e.name.startswith(".")]
    assert len(entries) == 1
    actual = shards.shard_bytes(entries[0])
    assert abs(estimate - actual) <= 0.1 * actual, (estimate, actual)
    stamps = _stamps(entries[0])
    assert len(stamps) == 3

    again = _hidden_note(_plan(capsys, recipe, "--set", "draft.lr=0.002"))
    assert f"reused from the cache ({entries[0]})" in again
    main(["build", str(recipe), "--set", "draft.lr=0.002", "--json"])
    second = json.loads(capsys.readouterr().out)
    draft = next(s for s in second["stages"] if s["name"] == "draft")
    assert draft["status"] == "ran" and draft["key"] != next(
        s for s in first["stages"] if s["name"] == "draft")["key"]
    assert draft["metrics"]["dump_seconds"] == 0.0
    assert _stamps(entries[0]) == stamps, "the shards were computed again"
    manifest = json.loads((isolated_cache / "draft" / draft["key"] / "manifest.json").read_text())
    assert manifest["info"]["hidden_states"]["reused"] is True
    assert manifest["info"]["data"]["reused"] is True


class _StopAtChunk(Progress):
    """Interrupts like Ctrl-C when the target has generated its `n`-th batch of responses."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def _advance(self, task_id: object, n: float, fields: dict) -> None:
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt


def test_interrupted_data_step_keeps_its_shards_and_makes_the_same_pool(target: Path, isolated_cache: Path) -> None:
    from trtbuild.core.layout import DRAFT_DATA
    from trtbuild.draft.config import DraftConfig
    from trtbuild.draft.data import greedy_fill, make_rows
    from trtbuild.draft.draft_data import _pool_spec, data_key, ensure_data, load_pool
    from trtbuild.draft.model import load_target

    config = DraftConfig(samples=20, seq_len=16, prompt_len=4, distill_fraction=0.5, shard_samples=4)  # 5 shards
    with pytest.raises(KeyboardInterrupt):  # shards 0-1 are text windows; 2, 3 written, 4 interrupted
        ensure_data(config, target, "target-key", None, _StopAtChunk(3))
    work = shards.resume_dir(DRAFT_DATA, data_key(config, "target-key", _fingerprint(config)))
    kept = _stamps(work)
    assert sorted(kept) == [shards.shard_name(i) for i in range(4)]
    made = ensure_data(config, target, "target-key", None, Progress())
    assert (made.kept, made.computed) == (4, 1)
    after = _stamps(made.path)
    assert {name: after[name] for name in kept} == kept
    # the same rows as one pass over the whole pool (one batch per prompt length)
    spec = _pool_spec(config, target, None)
    model = load_target(target)
    whole = make_rows(spec, 0, len(spec), lambda p, n: greedy_fill(model, p, n), 128)
    assert torch.equal(load_pool(made.path), whole)
    again = ensure_data(config.model_copy(update={"lr": 0.5, "steps": 7}), target, "target-key", None, Progress())
    assert again.reused and again.path == made.path
    damaged = made.path / shards.shard_name(4)  # a flipped byte: the set is made again, not trusted
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    remade = ensure_data(config, target, "target-key", None, Progress())
    assert not remade.reused and remade.computed == 5
    assert torch.equal(load_pool(remade.path), whole)


def _fingerprint(config: object) -> object:
    from trtbuild.core.data.sources import fingerprint

    return fingerprint(config.dataset, base_dir=None)  # type: ignore[attr-defined]


def test_the_shards_keys_do_not_follow_the_training_code() -> None:
    """The data and the dump are keyed by the code that makes them: editing the draft's training
    (model, loop, ModelOpt adaptation) or adding a recipe field keeps the shards."""
    from trtbuild.core.code_version import closure

    for module in ("trtbuild.draft.draft_data", "trtbuild.draft.hidden"):
        reached = set(closure(module))
        assert not reached & {"trtbuild.draft.model", "trtbuild.draft.train", "trtbuild.draft.config",
                              "trtbuild.draft.modelopt_compat", "trtbuild.draft.hidden_store"}, (module, reached)


def test_capture_runs_the_decoder_alone_and_bf16_compute_stays_close(target: Path) -> None:
    """The dump skips the lm_head: its final state is the whole LM's hidden_states[-1], bit for bit. A bf16
    store is computed under bf16 autocast: close to float32 compute, and not the same (autocast ran)."""
    from trtbuild.draft.hidden import AUX as AUX_KEY
    from trtbuild.draft.hidden import FINAL, capture
    from trtbuild.draft.model import load_target

    model = load_target(target)
    batch = torch.randint(3, 384, (20, 24), generator=torch.Generator().manual_seed(1))  # > FORWARD_ROWS
    layers = model.get_decoder().layers
    hooked: list[torch.Tensor] = []
    handles = [layers[i].register_forward_hook(lambda m, a, o: hooked.append(o[0] if isinstance(o, tuple) else o))
               for i in AUX]
    with torch.no_grad():
        whole = model(input_ids=batch, output_hidden_states=True)
    for handle in handles:
        handle.remove()
    exact = capture(model, batch, AUX)
    assert torch.equal(exact[FINAL], whole.hidden_states[-1])
    assert torch.equal(exact[AUX_KEY], torch.cat(hooked, dim=-1))
    bf16 = capture(model, batch, AUX, compute="bfloat16")
    for name in (AUX_KEY, FINAL):
        assert bf16[name].dtype == torch.float32
        error = float((bf16[name] - exact[name]).norm() / exact[name].norm())
        assert 0 < error < 0.05, (name, error)
