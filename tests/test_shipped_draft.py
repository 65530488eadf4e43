"""The shipped SmolLM2 draft (drafts/smollm2-135m-instruct-eagle3, served by recipes/smollm2-135m-cpu.yaml):
its pinned files hold, and its tau on the held-out requests the draft stage evaluates on is the value
recorded when it shipped (bench/draft_eval_spread.py --record), within the margin measured there over
request sets. The target is the real checkpoint the recipe's GGUF source makes (byte for byte)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_checkpoint import smollm2  # noqa: F401  (the session fixture)

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "smollm2-135m-cpu.yaml"

pytestmark = pytest.mark.slow


def test_the_shipped_draft_measures_its_recorded_tau(smollm2: Path) -> None:  # noqa: F811
    from trtbuild.cli.common import load
    from trtbuild.draft.config import DraftConfig
    from trtbuild.draft.evaluate import heldout_prompts, measure_tau
    from trtbuild.draft.loaded import check_pinned

    recipe = load(str(RECIPE), ())
    config = recipe.section(DraftConfig)
    assert config is not None and config.source == "path" and config.path
    draft_dir = recipe.resolve_path(config.path)
    assert set(config.sha256) == {"model.safetensors", "config.json"}
    check_pinned(draft_dir, config.sha256)
    recorded = json.loads((draft_dir / "metrics.json").read_text())["recorded_eval"]
    assert (recorded["prompts"], recorded["new_tokens"], recorded["max_draft_len"]) == (
        config.eval.prompts, config.eval.new_tokens, config.max_draft_len), "re-record: bench/draft_eval_spread.py"

    prompts = heldout_prompts(smollm2, config.eval, recipe.base_dir)
    measured = measure_tau(smollm2, draft_dir, prompts, config.eval.new_tokens, config.max_draft_len,
                           config.eval.mode)
    assert abs(measured["acceptance_length"] - recorded["tau"]) <= recorded["margin"], (measured, recorded)
    # the recipe gates its build on this draft: the gate holds on this machine too
    assert config.gate.min_acceptance_length is not None
    assert measured["acceptance_length"] >= config.gate.min_acceptance_length
