"""The draft's acceptance run and its gate: tau on the eval prompts (of the EAGLE-3 draft, or of n-gram
prompt lookup), and the build failing below draft.gate.min_acceptance_length, naming the seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError, UserError
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import StageContext
from trtbuild.draft.config import DraftConfig
from trtbuild.draft.evaluate import evaluate_draft
from trtbuild.model.config import ModelConfig


def numel(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def evaluate(config: DraftConfig, ctx: StageContext, target_dir: Path, draft_dir: Path | None
              ) -> dict[str, Any]:
    """tau on the eval prompts: of the EAGLE-3 draft in draft_dir, or of n-gram lookup (None)."""
    if config.eval.prompts == 0:
        return {"acceptance_length": None}

    return evaluate_draft(target_dir, draft_dir, config.eval, config.max_draft_len, ctx,
                          max_matching_ngram_size=config.max_matching_ngram_size)


def seeds(config: DraftConfig, recipe: RecipeInfo) -> str:
    """The seeds that shaped the measured tau: the draft's, and the tiny target's when it is one."""
    seeds = f"draft.seed {config.seed}"
    if config.train_seed is not None:
        seeds += f", draft.train_seed {config.train_seed}"
    model = recipe.section(ModelConfig)
    if model is not None and model.source == "tiny":
        seeds += f", model.tiny.seed {model.tiny.seed}"
    return seeds


def gate(config: DraftConfig, metrics: dict[str, Any], seeds: str = "") -> None:
    wanted = config.gate.min_acceptance_length
    if wanted is None:
        return
    tau = metrics.get("acceptance_length")
    if tau is None:
        raise UserError("draft.gate.min_acceptance_length is set but the evaluation is off (eval.prompts: 0)",
                        field="draft.gate.min_acceptance_length", fix="set draft.eval.prompts > 0")
    if tau < wanted:
        error = BuildError(f"measured acceptance length {tau:.3f} < gate {wanted} at max_draft_len "
                           f"{config.max_draft_len} ({config.eval.mode}, {seeds or 'seed unknown'})",
                           field="draft.gate.min_acceptance_length",
                           fix="train longer (draft.steps / draft.samples) or lower the gate")
        error.metrics = dict(metrics)  # type: ignore[attr-defined]  # reported by `build --json`
        raise error
