"""The draft stage end to end on a small random target: train -> export -> check -> tau; the gate;
resuming an interrupted training; loading a draft by path (and refusing a mismatched one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from draft_fixtures import write_target

from trtbuild.core.data.sources import TextSource
from trtbuild.core.errors import BuildError, UserError
from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.draft.stage import DraftConfig, DraftStage, resume_dir

SMALL = dict(samples=16, steps=4, batch_size=4, seq_len=32, prompt_len=8, draft_vocab_size=200,
             max_draft_len=3, checkpoint_every=2, eval={"prompts": 2, "prompt_len": 12, "new_tokens": 12})



def _Recipe(base_dir: Path) -> RecipeInfo:
    """What a stage reads from the recipe: where relative paths start, and (none here) other sections."""
    return RecipeInfo.standalone(base_dir)


@pytest.fixture(scope="module")
def model_artifact(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    root = tmp_path_factory.mktemp("model")
    write_target(root / "hf")
    return Artifact("model", "model-key", root)


def _run(config: DraftConfig, model: Artifact, out: Path, progress: Progress | None = None):  # type: ignore[no-untyped-def]
    out.mkdir(parents=True)
    ctx = StageContext(recipe=_Recipe(out.parent), inputs={"model": model}, out_dir=out,
                       progress=progress or Progress())
    return DraftStage().run(config, ctx)


@pytest.fixture(scope="module")
def trained(model_artifact: Artifact, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One short training run shared by the tests that only read its result."""
    import os

    root = tmp_path_factory.mktemp("trained")
    saved = os.environ.get("TRTBUILD_CACHE")
    os.environ["TRTBUILD_CACHE"] = str(root / "cache")
    config = DraftConfig(**SMALL)
    try:
        result = _run(config, model_artifact, root / "out")
    finally:  # restore, not delete: later tests (and CI's .ci-cache) read it
        if saved is None:
            del os.environ["TRTBUILD_CACHE"]
        else:
            os.environ["TRTBUILD_CACHE"] = saved
    return config, result, root / "out" / "eagle3", root / "cache"


def test_train_export_evaluate(trained, model_artifact: Artifact) -> None:  # type: ignore[no-untyped-def]
    from trtbuild.draft.evaluate import heldout_prompts, measure_tau

    config, result, draft_dir, cache = trained
    assert json.loads((draft_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    metrics, info = result.metrics, result.info
    assert metrics["train_steps"] == 4 and metrics["draft_vocab_size"] == 200
    assert 1.0 <= metrics["acceptance_length"] <= 1 + config.max_draft_len
    assert metrics["eval_decode_steps"] > 0 and len(metrics["acceptance_rates"]) == config.max_draft_len
    assert info["target"]["quantized"] is False and "UNQUANTIZED" in info["target"]["note"]
    assert any(c.startswith("tensorrt_llm") for c in info["consumers"])
    assert (cache / "resume").is_dir() and not any((cache / "resume").iterdir())  # cleaned up after export

    # Round trip: the runtime loading the exported draft afresh measures the same tau.
    prompts = heldout_prompts(model_artifact.path / "hf", config.eval, None)
    again = measure_tau(model_artifact.path / "hf", draft_dir, prompts, config.eval.new_tokens,
                        config.max_draft_len)
    assert again["acceptance_length"] == metrics["acceptance_length"]
    assert again["acceptance_rates"] == metrics["acceptance_rates"]
    # No eval dataset and no chat template (the tiny target): pydoc's held-out paragraphs, as before.
    assert config.eval.dataset is None and metrics["eval_prompts_from"].startswith("pydoc")
    assert prompts == heldout_prompts(model_artifact.path / "hf", config.eval.model_copy(
        update={"dataset": TextSource(kind="pydoc")}), None)


def test_gate_fails_the_build(trained, model_artifact: Artifact, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config, result, draft_dir, _ = trained
    tau = result.metrics["acceptance_length"]
    gated = DraftConfig(source="path", path=str(draft_dir), max_draft_len=config.max_draft_len,
                        eval=config.eval, gate={"min_acceptance_length": tau + 0.01})
    expected = (rf"draft.gate.min_acceptance_length: measured acceptance length {tau:.3f} < gate {tau + 0.01} "
                r"at max_draft_len 3 \(chain, draft.seed 0\)")
    with pytest.raises(BuildError, match=expected) as failed:
        _run(gated, model_artifact, tmp_path / "gated")
    assert failed.value.metrics["acceptance_length"] == tau  # what `build --json` reports with the failure
    passing = gated.model_copy(update={"gate": gated.gate.model_copy(update={"min_acceptance_length": tau})})
    assert _run(passing, model_artifact, tmp_path / "passing").metrics["acceptance_length"] == tau


def test_ngram_source_builds_nothing_and_measures_prompt_lookup(model_artifact: Artifact, tmp_path: Path) -> None:
    from trtbuild.draft.evaluate import heldout_prompts, measure_tau

    config = DraftConfig(source="ngram", max_draft_len=4, max_matching_ngram_size=3, eval=SMALL["eval"])
    result = _run(config, model_artifact, tmp_path / "ngram")
    metrics = result.metrics
    assert result.info == {"source": "ngram", "draft": None} and not (tmp_path / "ngram" / "eagle3").exists()
    assert json.loads((tmp_path / "ngram" / "ngram.json").read_text())["max_matching_ngram_size"] == 3
    assert metrics["eval_mode"] == "ngram" and len(metrics["acceptance_rates"]) == 4
    prompts = heldout_prompts(model_artifact.path / "hf", config.eval, None)
    again = measure_tau(model_artifact.path / "hf", None, prompts, config.eval.new_tokens, 4,
                        max_matching_ngram_size=3)
    assert again["acceptance_length"] == metrics["acceptance_length"] >= 1.0


def test_gate_needs_an_evaluation() -> None:
    config = DraftConfig(**{**SMALL, "eval": {"prompts": 0}, "gate": {"min_acceptance_length": 2.0}})
    from trtbuild.draft.acceptance import gate as _gate

    with pytest.raises(UserError, match="evaluation is off"):
        _gate(config, {"acceptance_length": None})


class _StopAfter(Progress):
    """Interrupts the training like Ctrl-C after `n` optimizer steps."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def _advance(self, task_id: Any, n: float, fields: dict[str, Any]) -> None:
        if "loss" in fields:
            self.left -= 1
            if self.left == 0:
                raise KeyboardInterrupt


def test_interrupted_training_resumes(model_artifact: Artifact, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    config = DraftConfig(**{**SMALL, "eval": {"prompts": 0}})
    with pytest.raises(KeyboardInterrupt):
        _run(config, model_artifact, tmp_path / "first", _StopAfter(3))  # checkpoint at step 2 exists
    checkpoint = resume_dir(config, model_artifact.key)
    assert (checkpoint / "state.safetensors").is_file() and (checkpoint / "state.json").is_file()
    trained_before = json.loads((checkpoint / "state.json").read_text())["seconds"]
    assert trained_before > 0
    import os

    data = Path(os.environ["TRTBUILD_CACHE"]) / "draft-data"  # the pool: its own cache entry, kept
    assert [e for e in data.iterdir() if (e / "manifest.json").is_file()]
    resumed = _run(config, model_artifact, tmp_path / "second")
    assert resumed.info["resumed_from_step"] == 2
    assert resumed.metrics["train_seconds"] >= round(trained_before, 1)  # the segment before the kill counts
    straight = _run(config, model_artifact, tmp_path / "third")  # resume dir is gone: from scratch
    assert straight.info["resumed_from_step"] == 0
    a = load_file(str(tmp_path / "second" / "eagle3" / "model.safetensors"))
    b = load_file(str(tmp_path / "third" / "eagle3" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(bool((a[k] == b[k]).all()) for k in a), "resumed training differs from an uninterrupted one"


class _Payload:
    """Unpickling this creates a file: the planted-pickle attack of issue 13 (finding 2)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.write_text, (self.marker, "pwned"))


def test_planted_pickles_in_the_resume_dir_are_inert(model_artifact: Artifact, tmp_path: Path) -> None:
    import pickle

    config = DraftConfig(**{**SMALL, "steps": 2, "eval": {"prompts": 0}})
    planted = resume_dir(config, model_artifact.key)
    planted.mkdir(parents=True)
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    for name in ("state.pt", "pool.pt", "state.safetensors", "pool.safetensors"):
        (planted / name).write_bytes(payload)
    (planted / "state.json").write_text(json.dumps({"step": 1, "sha256": "0" * 64, "accuracy": [],
                                                    "loss": None, "param_groups": []}))
    result = _run(config, model_artifact, tmp_path / "out")
    assert not marker.exists()
    assert result.info["resumed_from_step"] == 0  # the bogus checkpoint was ignored, training started over


def test_no_unpickling_in_the_sources() -> None:
    """torch.load, pickle and friends unpickle; trtbuild reads tensors with safetensors only, except the
    published-draft converter's one weights-only torch.load (trtbuild/draft/pickled.py)."""
    import re

    root = Path(__file__).resolve().parent.parent
    pattern = re.compile(r"torch\.load\(|\bpickle\.|import pickle\b|weights_only=False|joblib\.load|dill\.load")
    offenders = [f"{path.relative_to(root)}:{n}" for folder in ("trtbuild", "plugins", "scripts", "bench")
                 for path in (root / folder).rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    allowed = [o for o in offenders if o.startswith("trtbuild/draft/pickled.py:")]
    assert offenders == allowed  # there: `import pickle` (for its error type) and the one weights-only load
    text = (root / "trtbuild" / "draft" / "pickled.py").read_text()
    assert text.count("torch.load(") == 1 and "weights_only=True" in text.split("torch.load(")[1].split(")")[0]
    assert "pickle.load" not in text and "pickle.Unpickler" not in text


def test_load_by_path(trained, model_artifact: Artifact, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, _, draft_dir, _ = trained
    loaded = _run(DraftConfig(source="path", path=str(draft_dir), eval={"prompts": 0}), model_artifact,
                  tmp_path / "b")
    assert loaded.info["source"] == "path" and loaded.metrics["draft_vocab_size"] == 200
    assert loaded.metrics["acceptance_length"] is None
    assert (tmp_path / "b" / "eagle3" / "model.safetensors").read_bytes() == \
        (draft_dir / "model.safetensors").read_bytes()


def test_mismatched_path_is_refused_before_any_work(trained, model_artifact: Artifact,  # type: ignore[no-untyped-def]
                                                    tmp_path: Path) -> None:
    import shutil

    _, _, draft_dir, _ = trained
    other = tmp_path / "draft-for-an-8-layer-target"
    shutil.copytree(draft_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 4]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"draft.eagle_aux_hidden_state_layer_ids: aux layer id 4"):
        _run(DraftConfig(source="path", path=str(other)), model_artifact, tmp_path / "b")
    assert not (tmp_path / "b" / "eagle3").exists()


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="source: path needs `path:`"):
        DraftConfig(source="path")
    with pytest.raises(ValueError, match="source: hub needs `repo_id:`"):
        DraftConfig(source="hub")
    assert DraftConfig(samples=100, batch_size=10, epochs=2).total_steps() == 20


def test_train_seed_reuses_the_pool_and_reseeds_the_draft(model_artifact: Artifact, tmp_path: Path) -> None:
    """draft.train_seed: a seed spread at one data size. The pool is found in the cache, not regenerated;
    another train seed trains another draft, and the default (train_seed = seed) is the seed's draft."""
    from safetensors.torch import load_file

    base = {**SMALL, "steps": 2, "eval": {"prompts": 0}}
    first = _run(DraftConfig(**base), model_artifact, tmp_path / "seed0")
    same = _run(DraftConfig(**base, train_seed=0), model_artifact, tmp_path / "train-seed0")
    other = _run(DraftConfig(**base, train_seed=1), model_artifact, tmp_path / "train-seed1")
    assert first.info["data"]["key"] == other.info["data"]["key"]
    assert same.info["data"]["reused"] is True and other.info["data"]["reused"] is True
    assert resume_dir(DraftConfig(**base, train_seed=1), "k") != resume_dir(DraftConfig(**base), "k")
    weights = {name: load_file(str(tmp_path / name / "eagle3" / "model.safetensors"))
               for name in ("seed0", "train-seed0", "train-seed1")}
    assert all(torch.equal(weights["seed0"][k], weights["train-seed0"][k]) for k in weights["seed0"])
    assert not torch.equal(weights["seed0"]["fc.weight"], weights["train-seed1"]["fc.weight"])
