"""Offline training on the tiny target reaches a tau inside the online seed spread (slow: a tiny target
is trained first, then four drafts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.draft.stage import DraftConfig, DraftStage

pytestmark = pytest.mark.slow

TINY = {"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 256, "vocab_size": 512, "seq_len": 128, "batch_size": 8, "steps": 150,
        "warmup_steps": 10, "processes": 1}
DRAFT = {"samples": 64, "seq_len": 48, "prompt_len": 16, "distill_fraction": 1.0, "steps": 40, "batch_size": 8,
         "aux_layers": [0, 1, 2], "max_draft_len": 3, "shard_samples": 16,
         "eval": {"prompts": 6, "prompt_len": 32, "new_tokens": 24}}
SEEDS = (0, 1, 2)



def _Recipe() -> RecipeInfo:
    return RecipeInfo.standalone()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    from trtbuild.model.tiny import TinyModelConfig, build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_model(TinyModelConfig(**TINY), root / "hf", Progress())
    return Artifact("model", "tiny-key", root)


def _tau(tiny: Artifact, out: Path, seed: int, mode: str) -> dict:
    out.mkdir(parents=True)
    ctx = StageContext(recipe=_Recipe(), inputs={"model": tiny}, out_dir=out, progress=Progress())
    return DraftStage().run(DraftConfig(**DRAFT, seed=seed, hidden_states=mode), ctx).metrics


def test_offline_tau_is_inside_the_online_seed_spread(tiny: Artifact, tmp_path: Path) -> None:
    online = [_tau(tiny, tmp_path / f"online-{s}", s, "online")["acceptance_length"] for s in SEEDS]
    assert max(online) > 1.2, f"the drafts learned nothing ({online}): the comparison would be empty"
    offline = _tau(tiny, tmp_path / "offline", SEEDS[0], "offline")
    assert min(online) <= offline["acceptance_length"] <= max(online), (offline["acceptance_length"], online)
    assert offline["dump_seconds"] > 0 and offline["hidden_states_bytes"] > 0
