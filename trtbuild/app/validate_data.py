"""What `validate` reads so a build does not fail (or hang) on it later: the data files a build will
read (UTF-8, record shape, the text field, enough text for one window), Hugging Face datasets in
the local cache, tokenizer directories (a tokenizer there, ids within the target's vocabulary),
the target's config.json shapes, output paths, the deployment's token limits against the model's
context and engine, its memory, its queue delay and model name (issue 24 finding 11).

Each problem is one line `field: message (fix: ...)`, placed at the field's line by preflight.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trtbuild.app import crosschecks
from trtbuild.app.crosschecks import _target_shapes
from trtbuild.app.recipe import Recipe
from trtbuild.core.data.sources import load_records
from trtbuild.core.errors import UserError
from trtbuild.core.ranks import resolve_device
from trtbuild.model.source import local_model_dir, text_config, uses_standin

GIB = 1 << 30
MAX_MODEL_NAME = 128  # a directory in the model repository and a URL path segment
MAX_QUEUE_DELAY_US = 10_000_000  # 10 s: longer holds every request of a quiet server that long
# Per local model instance beyond its weights: a Python backend stub with torch and transformers
# loaded (~0.6 GB each measured in issue 24: 64 instances of the tiny model took ~38 GB).
INSTANCE_OVERHEAD = 600 * (1 << 20)
SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")


def problems(recipe: Recipe) -> list[str]:
    try:
        shapes = _target_shapes(recipe)
    except (OSError, ValueError):
        shapes = None
    return (_output_dir(recipe) + _model_shapes(recipe) + _data_sources(recipe) + _tokenizers(recipe, shapes)
            + _deploy(recipe, shapes) + _training_processes(recipe))


def _int(shapes: dict[str, Any] | None, key: str) -> int | None:
    value = (shapes or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- output paths -----------------------------------------------------------------------------------

def _output_dir(recipe: Recipe) -> list[str]:
    out = Path(os.path.abspath(recipe.output_path))
    real = Path(os.path.realpath(out))
    fix = "(fix: give output_dir a directory of its own, e.g. ../build/<name>)"
    for system in ("/dev", "/proc", "/sys"):
        if real == Path(system) or Path(system) in real.parents or out == Path(system) or Path(system) in out.parents:
            return [f"output_dir: {out} is inside {system}, not a place for build outputs {fix}"]
    if out.exists() and not out.is_dir():
        return [f"output_dir: {out} exists and is not a directory {fix}"]
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return [f"output_dir: {probe} (on the way to {out}) is a file, not a directory {fix}"]
    return []


# -- the target's config.json -------------------------------------------------------------------------

def _model_shapes(recipe: Recipe) -> list[str]:
    model = recipe.model
    if model is None or model.source == "tiny":
        return []

    directory = local_model_dir(model, recipe)
    if directory is None:
        return []  # absent weights: the model stage's own preflight says so
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # unreadable: the model stage's preflight says so
    if not isinstance(config, dict):
        return []
    text = text_config(config)
    missing = [k for k in SHAPE_KEYS if not (isinstance(v := text.get(k), int) and not isinstance(v, bool) and v > 0)]
    if missing:
        field = "model.path" if model.source == "path" else "model.repo_id"
        return [f"{field}: {directory / 'config.json'} has no usable {', '.join(missing)} (positive integers), so "
                "the model's shapes are unknown (fix: use the model's published config.json)"]
    return []


# -- data files and datasets --------------------------------------------------------------------------

def _sources(recipe: Recipe) -> list[tuple[str, Any, int, bool]]:
    """(field, source, tokens needed, whether one record must hold them) of every text source a
    build reads: windows are cut from all records joined; an evaluation prompt is one record's start."""
    found = []
    quantize, draft = recipe.quantize, recipe.draft
    if quantize is not None:
        found += [("quantize.calibration.dataset", quantize.calibration.dataset, quantize.calibration.seq_len, False),
                  ("quantize.gate.eval_dataset", quantize.gate.eval_dataset, quantize.gate.seq_len, False)]
    if draft is not None and draft.source != "none":
        if draft.source == "train":
            found.append(("draft.dataset", draft.dataset, draft.seq_len, False))
        if draft.eval.prompts and draft.eval.dataset is not None:
            found.append(("draft.eval.dataset", draft.eval.dataset, draft.eval.prompt_len, True))
    return found


def _data_sources(recipe: Recipe) -> list[str]:
    out: list[str] = []
    read: dict[Path, list[Any] | str] = {}
    # A recipe checked away from its weights (a stand-in config speaks for them) is not on the machine
    # that builds it: its datasets are looked for there, not here.
    elsewhere = uses_standin(recipe)
    for field, source, window, one_record in _sources(recipe):
        if source.kind == "hf" and not elsewhere:
            out += _hf_cached(field, source, recipe.base_dir)
        if source.kind != "file":
            continue
        path = source.resolved_path(recipe.base_dir)
        if not path.is_file() or path.stat().st_size == 0:
            continue  # crosschecks reports a missing or empty file
        key = path.resolve()
        if key not in read:
            read[key] = _read_records(source, recipe.base_dir)
        records = read[key]
        if isinstance(records, str):
            out.append(f"{field}.path: {records}")
            continue
        # A token covers at least one byte of text (byte-level BPE, SentencePiece with byte fallback),
        # and each record may add a BOS / separator: fewer bytes than that cannot fill one window.
        sizes = [_record_bytes(r) + 2 for r in records]
        chats = any(isinstance(r, list) for r in records)  # a chat prompt is used whole, at any length
        if one_record and not chats and max(sizes) < window:
            out.append(f"{field}.path: the longest of the {len(records)} records in {path} has {max(sizes) - 2} "
                       f"bytes of text, fewer than the {window} tokens of one prompt (fix: give longer records, "
                       "or lower draft.eval.prompt_len)")
        elif not one_record and sum(sizes) < window:
            out.append(f"{field}.path: {path} holds {len(records)} records with {sum(sizes) - 2 * len(sizes)} bytes "
                       f"of text, fewer than the {window} tokens one window needs (fix: give more text, or a shorter "
                       "seq_len)")
    return out


def _record_bytes(record: Any) -> int:
    if isinstance(record, str):
        return len(record.encode("utf-8"))
    return sum(len(m["content"].encode("utf-8")) + len(m["role"]) + 2 for m in record)


def _read_records(source: Any, base_dir: Path) -> list[Any] | str:
    """The file's records as the build reads them, or why it cannot read them (one line)."""
    path = source.resolved_path(base_dir)
    try:
        raw = path.read_bytes()
        raw.decode("utf-8")
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror}) (fix: check the path and permissions)"
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return f"{path}:{line} is not UTF-8 text (byte {exc.start}) (fix: save the file as UTF-8)"
    try:
        return load_records(source, "train", base_dir=base_dir)
    except UserError as exc:
        where = f"{exc.file}:{exc.line}" if exc.file and exc.line else str(path)
        fix = f" (fix: {exc.fix})" if exc.fix else " (fix: one JSON object per line with a text field or a chat)"
        return f"{where}: {exc.message}{fix}"
    except RecursionError:
        return f"{path}: a record is nested too deeply (fix: one flat JSON object per line)"


def _hf_cached(field: str, source: Any, base_dir: Path) -> list[str]:
    """A dataset is read offline: it must be a local directory or in the datasets / hub cache."""
    name = str(source.hf)
    local = Path(name).expanduser()
    if (Path(base_dir) / name).is_dir() or (local.is_absolute() and local.is_dir()):
        return []
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets"))
    hub_cache = Path(os.environ.get("HF_HUB_CACHE", os.environ.get("HUGGINGFACE_HUB_CACHE", home / "hub")))
    candidates = [datasets_cache / name.replace("/", "___"), hub_cache / f"datasets--{name.replace('/', '--')}"]
    if any(c.is_dir() for c in candidates):
        return []
    return [f"{field}.hf: the Hugging Face dataset {name!r} is not in the local cache (looked in {datasets_cache} "
            f"and {hub_cache}); builds read datasets offline (fix: download it once with network access, "
            "or use a local .jsonl file)"]


# -- tokenizers --------------------------------------------------------------------------------------

def _tokenizers(recipe: Recipe, shapes: dict[str, Any] | None) -> list[str]:
    out: list[str] = []
    vocab = _int(shapes, "vocab_size")
    deploy = recipe.deploy
    if deploy is not None and deploy.tokenizer.path is not None:
        path = recipe.resolve_path(deploy.tokenizer.path)
        if path.is_dir():
            out += _tokenizer_dir("deploy.tokenizer.path", path, vocab)
    model = recipe.model
    if model is not None and model.source != "tiny":
        directory = local_model_dir(model, recipe)
        if directory is not None and (directory / "tokenizer.json").is_file():
            field = "model.path" if model.source == "path" else "model.repo_id"
            out += _tokenizer_dir(field, directory, vocab)
    return out


def _tokenizer_dir(field: str, path: Path, vocab: int | None) -> list[str]:
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return [f"{field}: {path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}) "
                "(fix: give the directory the model's tokenizer was saved to)"]
    if vocab is None or not (path / "tokenizer.json").is_file():
        return []
    largest = _largest_token_id(path / "tokenizer.json")
    if isinstance(largest, str):
        return [f"{field}: {largest}"]
    if largest is not None and largest >= vocab:
        return [f"{field}: the tokenizer in {path} has token ids up to {largest}, beyond the target's vocab_size "
                f"{vocab}: its ids would index past the embedding (fix: use the target model's own tokenizer)"]
    return []


def _largest_token_id(file: Path) -> int | None | str:
    """The largest id tokenizer.json can produce (vocabulary and added tokens), or why it is unreadable."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{file} is not a readable tokenizer.json ({str(exc).splitlines()[0][:80]}) (fix: save the tokenizer again)"
    if not isinstance(data, dict):
        return f"{file} is not a tokenizer.json object (fix: save the tokenizer again)"
    ids: list[int] = []
    model_vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
    if isinstance(model_vocab, dict):
        ids += [v for v in model_vocab.values() if isinstance(v, int)]
    elif isinstance(model_vocab, list):  # Unigram: [[piece, score], ...], ids are positions
        ids.append(len(model_vocab) - 1)
    ids += [t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
    return max(ids) if ids else None


# -- the deployment ----------------------------------------------------------------------------------

def _deploy(recipe: Recipe, shapes: dict[str, Any] | None) -> list[str]:
    deploy = recipe.deploy
    if deploy is None:
        return []
    out: list[str] = []
    if len(deploy.model_name) > MAX_MODEL_NAME:
        out.append(f"deploy.model_name: {len(deploy.model_name)} characters; a model name may have at most "
                   f"{MAX_MODEL_NAME} (it is a directory of the repository and part of every URL) (fix: shorten it)")
    if deploy.max_queue_delay_microseconds > MAX_QUEUE_DELAY_US:
        out.append(f"deploy.max_queue_delay_microseconds: {deploy.max_queue_delay_microseconds} µs holds a request "
                   f"up to {deploy.max_queue_delay_microseconds / 1e6:.0f} s waiting for others; at most "
                   f"{MAX_QUEUE_DELAY_US} (10 s) (fix: a few thousand µs at most is usual)")
    local = deploy.local
    context = _int(shapes, "max_position_embeddings")
    if context is not None and local.default_max_tokens >= context:
        out.append(f"deploy.local.default_max_tokens: {local.default_max_tokens} leaves no room for a prompt in the "
                   f"model's context of {context} tokens (fix: use at most {context - 1})")
    engine = recipe.engine
    if engine is not None and engine.max_seq_len is not None and local.max_tokens_limit > engine.max_seq_len:
        out.append(f"deploy.local.max_tokens_limit: {local.max_tokens_limit} exceeds engine.max_seq_len "
                   f"{engine.max_seq_len}, the prompt + output tokens one request may hold (fix: lower it, or raise "
                   "engine.max_seq_len)")
    if "local" in deploy.target:
        out += _local_memory(recipe, deploy)
    return out


def _local_memory(recipe: Recipe, deploy: Any) -> list[str]:
    weights = _target_weight_bytes(recipe)
    if weights is None:
        return []
    need = deploy.instance_count * (weights + INSTANCE_OVERHEAD)
    ram = crosschecks.machine_memory()  # looked up at call time: tests set the machine's memory
    if need <= ram:
        return []
    most = max(1, ram // (weights + INSTANCE_OVERHEAD))
    return [f"deploy.instance_count: {deploy.instance_count} local model instances need about {need / GIB:.1f} GiB "
            f"(each holds the weights, {weights / GIB:.2f} GiB, and a Python process, ~0.6 GiB), more than this "
            f"machine's {ram / GIB:.1f} GiB (fix: use at most {most})"]


def _target_weight_bytes(recipe: Recipe) -> int | None:
    """Bytes of the target's weights as served by the local runtime (float32 for the tiny model)."""
    model = recipe.model
    if model is None:
        return None
    if model.source == "tiny":
        t = model.tiny
        kv = t.num_key_value_heads * (t.hidden_size // t.num_attention_heads)
        params = (2 * t.vocab_size * t.hidden_size
                  + t.num_hidden_layers * (2 * t.hidden_size * (t.hidden_size + kv)
                                           + 3 * t.hidden_size * t.intermediate_size))
        return 4 * params

    directory = local_model_dir(model, recipe)
    if directory is None:
        return None
    return sum(p.stat().st_size for p in directory.glob("*.safetensors") if p.is_file()) or None


def _training_processes(recipe: Recipe) -> list[str]:
    """draft.train.processes on this machine (one node): each is a Python + torch process of its own
    and, on the CPU, holds its own float32 copy of the target (1/world of it under fsdp)."""
    draft = recipe.draft
    if draft is None or draft.source != "train" or draft.train.processes < 2 or draft.train.nodes > 1:
        return []
    train = draft.train
    ram = crosschecks.machine_memory()  # looked up at call time: tests set the machine's memory
    weights = (_target_weight_bytes(recipe) or 0) if resolve_device(train.device) == "cpu" else 0
    if train.target_sharding == "fsdp":
        weights //= train.world_size()
    each = INSTANCE_OVERHEAD + weights
    need = train.processes * each
    if need <= ram:
        return []
    copy = f" and its copy of the target, {weights / GIB:.2f} GiB" if weights else ""
    return [f"draft.train.processes: {train.processes} training processes need about {need / GIB:.1f} GiB (each "
            f"a Python + torch process, ~{INSTANCE_OVERHEAD / GIB:.1f} GiB,{copy}), more than this machine's "
            f"{ram / GIB:.1f} GiB (fix: use at most {max(1, ram // each)})"]
