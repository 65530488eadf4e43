"""`trtbuild plan` lines for offline draft training's shard sets: whether the data and hidden states are
reused, and the disk the hidden-state dump will take, computed before anything runs (nothing is
loaded or written)."""

from __future__ import annotations

from typing import Any

from trtbuild.core.data.sources import fingerprint
from trtbuild.core.errors import UserError
from trtbuild.core.hf_files import text_config
from trtbuild.core.layout import DRAFT_DATA, DRAFT_HIDDEN
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.draft import shards
from trtbuild.draft.build import resolve_aux_layers
from trtbuild.draft.config import DraftConfig
from trtbuild.draft.draft_data import data_key
from trtbuild.draft.hidden import estimate_bytes, hidden_key
from trtbuild.model.config import ModelConfig


def plan_notes(recipe: RecipeInfo, steps: list[Any]) -> list[str]:
    draft = recipe.section(DraftConfig)
    if draft is None or draft.source != "train" or draft.hidden_states != "offline":
        return []  # online training's pool is small next to the target; plan stays quiet about it
    model_key = next((s.key for s in steps if s.name == "model"), None)
    if model_key is None:
        return []
    key = data_key(draft, model_key, fingerprint(draft.dataset, base_dir=recipe.base_dir))
    count = shards.shard_count(draft.samples, draft.shard_samples)
    notes = [f"draft data: {_status(DRAFT_DATA, key, count)} ({draft.samples} sequences x {draft.seq_len} "
             f"tokens, {count} shards)"]
    dims = _target_dims(recipe)
    if dims is None:
        return [*notes, "draft hidden states (offline): the target's config is not readable yet; the disk "
                "they take is printed once it is"]

    num_layers, hidden = dims
    try:
        aux = resolve_aux_layers(draft, num_layers)
    except UserError as exc:
        return [*notes, f"draft hidden states (offline): {exc.one_line()}"]
    dtype = draft.hidden_states_dtype
    size = estimate_bytes(draft.samples, draft.seq_len, len(aux), hidden, dtype, draft.shard_samples)
    width = 4 if dtype == "float32" else 2
    hkey = hidden_key(key, aux, dtype)
    notes.append(f"draft hidden states (offline): {draft.samples} samples x {draft.seq_len} tokens x "
                 f"{len(aux) + 1} layers (captured {aux} + final) x hidden {hidden} x {width} bytes "
                 f"({dtype}) = {_human(size)} on disk in {count} shards; {_status(DRAFT_HIDDEN, hkey, count)}")
    return notes


def _status(kind: str, key: str, count: int) -> str:
    found = shards.entry_dir(kind, key)
    if found is not None:
        return f"reused from the cache ({found})"
    partial = shards.resume_dir(kind, key)
    kept = len(shards.finished(partial, count)) if partial.is_dir() else 0
    return f"will be computed ({kept}/{count} shards kept from an interrupted run)" if kept else "will be computed"


def _target_dims(recipe: RecipeInfo) -> tuple[int, int] | None:
    """(decoder layers, hidden size) of the target: its config.json (or stand-in), the tiny's config."""
    model = recipe.section(ModelConfig)
    if model is None:
        return None
    if model.source == "tiny":
        return int(model.tiny.num_hidden_layers), int(model.tiny.hidden_size)
    found = recipe.target_hf_config()
    if found is None:
        return None
    text = text_config(found[0])
    return int(text["num_hidden_layers"]), int(text["hidden_size"])


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
