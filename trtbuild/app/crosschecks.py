"""Rules that span sections, checked by `validate` before any work: what a build would otherwise hit
minutes in (a draft vocabulary larger than the target's, a calibration window longer than the
context, a gate with nothing to measure, a data file that is not there, sizes this machine's memory
cannot hold). Each problem is one line `field: message (fix: ...)`; preflight adds file and line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtbuild.app.recipe import Recipe
from trtbuild.app.stages import STAGE_ORDER, all_stages
from trtbuild.draft.config import DraftConfig
from trtbuild.model.source import target_hf_config, text_config

GIB = 1 << 30


def problems(recipe: Recipe) -> list[str]:
    out = _dependencies(recipe)
    shapes = _target_shapes(recipe)
    out += _draft(recipe, shapes) + _quantize(recipe, shapes) + _bench(recipe, shapes)
    out += _data_files(recipe) + _deploy(recipe) + _memory(recipe, shapes)
    return out


def _dependencies(recipe: Recipe) -> list[str]:
    out = []
    for stage in all_stages():
        if recipe.stage_config(stage.name) is None:
            continue
        for dep in stage.depends_on:
            if recipe.stage_config(dep) is None:
                out.append(f"{stage.name}: the {stage.name} stage reads the {dep} stage's output, and the recipe "
                           f"has no `{dep}:` section (fix: add `{dep}: {{}}` or remove `{stage.name}:`)")
    return out


def _target_shapes(recipe: Recipe) -> dict[str, Any] | None:
    """vocab_size, num_hidden_layers, max_position_embeddings of the target, where they are known."""
    model = recipe.model
    if model is None:
        return None
    if model.source == "tiny":
        return model.tiny.hf_config()

    found = target_hf_config(recipe)
    return text_config(found[0]) if found else None


def _int(shapes: dict[str, Any] | None, key: str) -> int | None:
    value = (shapes or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _draft(recipe: Recipe, shapes: dict[str, Any] | None) -> list[str]:
    draft = recipe.draft
    if draft is None or draft.source == "none":
        return []
    out = []
    gate = draft.gate.min_acceptance_length
    if gate is not None and draft.eval.prompts == 0:
        out.append(f"draft.gate.min_acceptance_length: {gate} is set but draft.eval.prompts is 0, so nothing "
                   "measures it (fix: set draft.eval.prompts > 0 or remove the gate)")
    vocab, layers = _int(shapes, "vocab_size"), _int(shapes, "num_hidden_layers")
    context = _int(shapes, "max_position_embeddings")
    if draft.source == "train":
        if draft.draft_vocab_size is not None and vocab is not None and draft.draft_vocab_size > vocab:
            out.append(f"draft.draft_vocab_size: {draft.draft_vocab_size} exceeds the target's vocab_size {vocab} "
                       f"(fix: use at most {vocab})")
        if draft.aux_layers is not None and layers is not None:
            bad = [i for i in draft.aux_layers if not 0 <= i < layers]
            if bad:
                out.append(f"draft.aux_layers: layer {bad[0]} is outside the target's {layers} layers "
                           f"(fix: pick indices 0..{layers - 1})")
            elif len(set(draft.aux_layers)) != len(draft.aux_layers):
                out.append(f"draft.aux_layers: {draft.aux_layers} repeats a layer (fix: list each layer once)")
        if context is not None and draft.seq_len > context:
            out.append(f"draft.seq_len: {draft.seq_len} exceeds the target's context {context} "
                       f"(fix: use at most {context})")
        if draft.prompt_len >= draft.seq_len:
            out.append(f"draft.prompt_len: {draft.prompt_len} leaves nothing to generate in seq_len "
                       f"{draft.seq_len} (fix: make prompt_len < seq_len)")
    if context is not None and draft.eval.prompts and draft.eval.prompt_len + draft.eval.new_tokens > context:
        out.append(f"draft.eval.new_tokens: prompt_len {draft.eval.prompt_len} + new_tokens {draft.eval.new_tokens} "
                   f"exceed the target's context {context} (fix: lower them)")
    return out


def _quantize(recipe: Recipe, shapes: dict[str, Any] | None) -> list[str]:
    quantize = recipe.quantize
    context = _int(shapes, "max_position_embeddings")
    if quantize is None or context is None:
        return []
    out = []
    for field, seq_len in (("quantize.calibration.seq_len", quantize.calibration.seq_len),
                           ("quantize.gate.seq_len", quantize.gate.seq_len)):
        if seq_len > context:
            out.append(f"{field}: {seq_len} exceeds the target's context {context} (fix: use at most {context})")
    return out


def _bench(recipe: Recipe, shapes: dict[str, Any] | None) -> list[str]:
    bench = recipe.bench
    if bench is None:
        return []
    out = []
    draft = recipe.draft
    if draft is None or draft.source == "none":
        out.append("bench: bench compares plain and speculative decoding and the recipe has no draft "
                   "(fix: add a `draft:` section or remove `bench:`)")
    elif bench.max_draft_len > draft.max_draft_len:
        out.append(f"bench.max_draft_len: {bench.max_draft_len} exceeds draft.max_draft_len {draft.max_draft_len}, "
                   f"the length the draft is trained and served at (fix: use at most {draft.max_draft_len})")
    if bench.tree == "dynamic" and bench.max_total_draft_tokens < bench.max_draft_len:
        out.append(f"bench.max_total_draft_tokens: {bench.max_total_draft_tokens} is below max_draft_len "
                   f"{bench.max_draft_len} (fix: raise it)")
    context = _int(shapes, "max_position_embeddings")
    if context is not None and bench.prompt_len + bench.max_new_tokens > context:
        out.append(f"bench.max_new_tokens: prompt_len {bench.prompt_len} + max_new_tokens {bench.max_new_tokens} "
                   f"exceed the target's context {context} (fix: lower them)")
    if bench.prompts != "pydoc-heldout":
        out += _file_problem("bench.prompts", recipe.resolve_path(bench.prompts), (".txt", ".jsonl"))
    return out


def _data_files(recipe: Recipe) -> list[str]:
    sources = []
    quantize, draft = recipe.quantize, recipe.draft
    if quantize is not None:
        sources += [("quantize.calibration.dataset", quantize.calibration.dataset),
                    ("quantize.gate.eval_dataset", quantize.gate.eval_dataset)]
    if draft is not None and draft.source != "none":
        if draft.source == "train":
            sources.append(("draft.dataset", draft.dataset))
        if draft.eval.prompts and draft.eval.dataset is not None:
            sources.append(("draft.eval.dataset", draft.eval.dataset))
    out = []
    for field, source in sources:
        if source.kind == "file":
            out += _file_problem(f"{field}.path", source.resolved_path(recipe.base_dir), (".txt", ".jsonl"))
    return out


def _file_problem(field: str, path: Path, suffixes: tuple[str, ...]) -> list[str]:
    if not path.exists():
        return [f"{field}: {path} not found (fix: give an existing file, relative to the recipe)"]
    if not path.is_file():
        return [f"{field}: {path} is not a regular file (fix: give a {' or '.join(suffixes)} file)"]
    if path.stat().st_size == 0:
        return [f"{field}: {path} is empty (fix: give a file with text in it)"]
    return []


def _deploy(recipe: Recipe) -> list[str]:
    deploy = recipe.deploy
    if deploy is None:
        return []
    out = []
    if deploy.local.default_max_tokens > deploy.local.max_tokens_limit:
        out.append(f"deploy.local.default_max_tokens: {deploy.local.default_max_tokens} exceeds "
                   f"deploy.local.max_tokens_limit {deploy.local.max_tokens_limit} (fix: lower it)")
    if deploy.tokenizer.path is not None:
        path = recipe.resolve_path(deploy.tokenizer.path)
        if not path.is_dir():
            out.append(f"deploy.tokenizer.path: {path} is not a directory (fix: give a tokenizer directory)")
    return out


def machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def gpu_memory() -> int | None:
    """Memory of this host's first CUDA GPU, None without one (torch is imported only when asked)."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:  # no torch, no driver: nothing to say
        return None
    return None


def _draft_batch_memory(draft: DraftConfig, vocab: int, hidden: int, ram: int) -> tuple[str, str, float, int, str] | None:
    """The draft's per-forward logits and activations, sized by what one rank holds (its shard of the global
    batch, or micro_batch_size), against one GPU's memory when it trains on CUDA, else this host's."""
    train = draft.train
    world = train.world_size()
    shard = -(-draft.batch_size // world)
    rows = min(train.micro_batch_size or shard, shard)
    need = (rows * draft.seq_len * (draft.draft_vocab_size or vocab) * 4 * 3 * draft.ttt_steps
            + rows * draft.seq_len * hidden * 4 * 12)
    on_cuda = train.device == "cuda" or train.device == "auto"
    limit = gpu_memory() if on_cuda else None
    if on_cuda and limit is None and train.device == "cuda":
        return None  # trains on a GPU this host does not have: its memory is not known here
    where = "one GPU's" if limit is not None else "this machine's"
    field = "draft.train.micro_batch_size" if train.micro_batch_size else "draft.batch_size"
    what = (f"draft logits of {rows} x {draft.seq_len} tokens x {draft.ttt_steps} steps per rank "
            f"({draft.batch_size} sequences over {world} rank{'s' if world > 1 else ''})")
    return field, what, need, limit if limit is not None else ram, where


def _memory(recipe: Recipe, shapes: dict[str, Any] | None) -> list[str]:
    """Rough peak memory of what the recipe's own numbers size (the target's weights are not counted:
    they are what they are); an estimate over this machine's memory fails here, not an hour in."""
    ram = machine_memory()
    vocab = _int(shapes, "vocab_size") or 0
    hidden = _int(shapes, "hidden_size") or 0
    estimates: list[tuple[str, str, float]] = []
    device_lines: list[str] = []
    model = recipe.model
    if model is not None and model.source == "tiny":
        t = model.tiny
        kv = t.num_key_value_heads * (t.hidden_size // t.num_attention_heads)
        params = (2 * t.vocab_size * t.hidden_size
                  + t.num_hidden_layers * (2 * t.hidden_size * (t.hidden_size + kv) + 3 * t.hidden_size * t.intermediate_size))
        tokens = t.batch_size * t.seq_len
        activations = tokens * (t.num_hidden_layers * (16 * t.hidden_size + 4 * t.intermediate_size) + 3 * t.vocab_size)
        estimates.append(("model.tiny", f"{params / 1e6:.0f}M parameters trained on {t.batch_size} x {t.seq_len} "
                          "token batches", 16 * params + 4 * activations))
    draft = recipe.draft
    if draft is not None and draft.source == "train":
        pool = draft.samples * draft.seq_len * 8
        estimates.append(("draft.samples", f"a pool of {draft.samples} x {draft.seq_len} tokens", pool))
        per_rank = _draft_batch_memory(draft, vocab, hidden, ram)  # on the device it runs on
        if per_rank is not None and per_rank[2] > per_rank[3]:
            field, what, need, limit, where = per_rank
            device_lines.append(f"{field}: needs about {need / GIB:.1f} GiB of memory for {what}, more than "
                                f"{where} {limit / GIB:.1f} GiB (fix: lower it, or raise draft.train.processes)")
    quantize = recipe.quantize
    if quantize is not None:
        cal, gate = quantize.calibration, quantize.gate
        estimates.append(("quantize.calibration.num_samples", f"{cal.num_samples} x {cal.seq_len} calibration "
                          "tokens", cal.num_samples * cal.seq_len * 8))
        for field, batch, seq in (("quantize.calibration.batch_size", cal.batch_size, cal.seq_len),
                                  ("quantize.gate.batch_size", gate.batch_size, gate.seq_len)):
            estimates.append((field, f"logits of {batch} x {seq} tokens", batch * seq * (vocab * 4 * 3 + hidden * 4 * 16)))
    return [f"{field}: needs about {need / GIB:.1f} GiB of memory for {what}, more than this machine's "
                  f"{ram / GIB:.1f} GiB (fix: lower it)" for field, what, need in estimates if need > ram] + device_lines


__all__ = ["STAGE_ORDER", "problems"]
