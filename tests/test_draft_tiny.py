"""The tiny recipe's draft on the embedded tiny target: trains on CPU and reaches tau >= 3 at
max_draft_len 5 (chain) on held-out pydoc text; the exported draft gives the same tau when the
runtime loads it afresh. Slow: it trains the tiny target (unless TRTBUILD_TINY_TARGET names an
existing one) and the draft."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from trtbuild.progress import Progress
from trtbuild.stages.base import Artifact, StageContext
from trtbuild.stages.draft import DraftConfig, DraftStage

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "tiny-cpu.yaml"
# Used until recipes/tiny-cpu.yaml carries a `draft:` section (then the recipe's own is tested).
TINY_DRAFT = {"max_draft_len": 5, "draft_vocab_size": 1024, "samples": 512, "distill_fraction": 0.75,
              "seq_len": 128, "batch_size": 8, "steps": 200, "lr": 2e-3,
              "gate": {"min_acceptance_length": 3.0}}


class _Recipe:
    base_dir = RECIPE.parent

    def resolve_path(self, value: str) -> Path:
        return (self.base_dir / value).resolve()

    def stage_config(self, name: str) -> Any:
        return None


def _draft_settings() -> dict[str, Any]:
    section = (yaml.safe_load(RECIPE.read_text()) or {}).get("draft") if RECIPE.is_file() else None
    return section or TINY_DRAFT


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    given = os.environ.get("TRTBUILD_TINY_TARGET")
    root = tmp_path_factory.mktemp("tiny")
    if given:
        (root / "hf").symlink_to(Path(given).resolve(), target_is_directory=True)
    else:
        from trtbuild.tiny import TinyModelConfig, build_tiny_model

        build_tiny_model(TinyModelConfig(), root / "hf", Progress())
    return Artifact("model", "tiny", root)


@pytest.mark.slow
def test_tiny_draft_reaches_tau_3(tiny_target: Artifact, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from trtbuild.eagle3.evaluate import heldout_prompts, measure_tau

    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "cache"))
    config = DraftConfig(**_draft_settings())
    assert config.max_draft_len == 5 and config.eval.mode == "chain"
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext(recipe=_Recipe(), inputs={"model": tiny_target}, out_dir=out, progress=Progress())
    result = DraftStage().run(config, ctx)  # the gate raises BuildError below tau 3
    tau = result.metrics["acceptance_length"]
    assert tau >= 3.0, result.metrics

    prompts = heldout_prompts(tiny_target.path / "hf", config.eval, RECIPE.parent)
    again = measure_tau(tiny_target.path / "hf", out / "eagle3", prompts, config.eval.new_tokens,
                        config.max_draft_len)
    assert again["acceptance_length"] == tau
