"""Text sources for calibration, evaluation and draft training, and how they become token windows.

A recipe names a source in one of three ways:

    dataset: pydoc                                   # the built-in corpus (train / held-out split)
    dataset: data/chat.jsonl                         # a local .txt or .jsonl file
    dataset: {hf: org/name, config: x, split: train, field: text}   # a Hugging Face dataset, offline

`.txt` files are split into paragraphs at blank lines. `.jsonl` records carry a text field
(`field`, default `text`) or a chat: `conversations` (ShareGPT: from/value) or `messages`
(OpenAI: role/content). Chats are rendered with the tokenizer's chat template when it has one.

Splits: the pydoc corpus has a fixed train / held-out split (trtbuild.core.data.pydoc_corpus). A file
source gives all its records whatever the split (name a different file for evaluation); a
Hugging Face source reads `split` if set, else `train` for training and the first of
validation / test / train that exists for evaluation.

Heavy imports (torch, datasets) stay inside functions: the recipe schema imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtbuild.core.data import pydoc_corpus
from trtbuild.core.errors import UserError

if TYPE_CHECKING:
    import torch

Split = Literal["train", "eval"]
Message = dict[str, str]  # {"role": ..., "content": ...}
Record = str | list[Message]

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "tool": "tool", "function": "tool"}


class TextSource(BaseModel):
    """Where text comes from. A plain string in the recipe is shorthand (see module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["pydoc", "file", "hf"] = Field(
        description="pydoc: the built-in corpus; file: a local .txt/.jsonl; hf: a Hugging Face dataset "
                    "read from the local cache only (offline)")
    path: str | None = Field(default=None, description="file: path of the .txt or .jsonl file")
    hf: str | None = Field(default=None, description="hf: dataset name (org/name) or a local dataset dir")
    config: str | None = Field(default=None, description="hf: dataset configuration name")
    split: str | None = Field(
        default=None, description="hf: split to read (default: train for training, validation/test for eval)")
    field: str | None = Field(
        default=None, description="text field of jsonl / hf records (default `text`; chats are found by "
                                  "`conversations` or `messages`)")
    max_records: int | None = Field(default=None, gt=0, le=10**9, strict=True,
                                    description="read at most this many records")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str | Path):
            text = str(value)
            if text == "pydoc":
                return {"kind": "pydoc"}
            if text.startswith("hf:"):
                return {"kind": "hf", "hf": text[3:]}
            return {"kind": "file", "path": text}
        if isinstance(value, dict) and "kind" not in value:
            if "hf" in value:
                return {"kind": "hf", **value}
            if "path" in value:
                return {"kind": "file", **value}
        return value

    @model_validator(mode="after")
    def _check(self) -> TextSource:
        if self.kind == "file":
            if not self.path:
                raise ValueError("a file source needs `path`")
            if Path(self.path).suffix not in (".txt", ".jsonl"):
                raise ValueError(f"unsupported file type {self.path!r}: use .txt or .jsonl")
        if self.kind == "hf" and not self.hf:
            raise ValueError("a Hugging Face source needs `hf: <dataset name>`")
        return self

    def describe(self) -> str:
        if self.kind == "pydoc":
            return "pydoc"
        if self.kind == "file":
            return str(self.path)
        return f"hf:{self.hf}" + (f"/{self.config}" if self.config else "")

    def resolved_path(self, base_dir: Path | None = None) -> Path:
        """The file of a file source; relative paths are taken from `base_dir` (the recipe's dir)."""
        assert self.path is not None
        path = Path(self.path).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        return path


# --------------------------------------------------------------------------------------------------
# Records


def load_records(source: TextSource, split: Split, *, base_dir: Path | None = None) -> list[Record]:
    """Texts (str) and chats (list of {role, content}) of `source`, in file order."""
    if source.kind == "pydoc":
        train, heldout = pydoc_corpus.split()
        records: list[Record] = list(train if split == "train" else heldout)
    elif source.kind == "file":
        records = _file_records(source, base_dir)
    else:
        records = _hf_records(source, split, base_dir)
    if source.max_records is not None:
        records = records[: source.max_records]
    if not records:
        raise UserError(f"text source {source.describe()} has no records", field="dataset")
    return records


def load_texts(source: TextSource, split: Split, *, tokenizer: Any = None,
               base_dir: Path | None = None) -> list[str]:
    """The records of `source` as strings; chats rendered with `tokenizer`'s chat template."""
    return [render(record, tokenizer) for record in load_records(source, split, base_dir=base_dir)]


def render(record: Record, tokenizer: Any = None) -> str:
    if isinstance(record, str):
        return record
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(record, tokenize=False)
    # No template (e.g. a base model): a plain transcript keeps the words the model will see.
    return "\n".join(f"{m['role']}: {m['content']}" for m in record)


def _file_records(source: TextSource, base_dir: Path | None) -> list[Record]:
    path = source.resolved_path(base_dir)
    if not path.is_file():
        raise UserError(f"text file {path} not found", field="dataset",
                        fix="give an existing .txt/.jsonl path (relative paths start at the recipe's dir)")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
    records: list[Record] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"invalid JSON: {exc.msg}", file=str(path), line=number) from None
        records.append(_record(obj, source.field, where=(str(path), number)))
    return records


def _record(obj: Any, field: str | None, *, where: tuple[str, int | None]) -> Record:
    """One jsonl / dataset row as a text or a chat; a row without either is a UserError."""
    file, line = where
    if not isinstance(obj, dict):
        raise UserError(f"expected a JSON object, got {type(obj).__name__}", file=file, line=line)
    name = field or "text"
    if name in obj:
        value = obj[name]
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return _chat(value, file=file, line=line)
        raise UserError(f"field {name!r} is {type(value).__name__}, expected a string or a chat",
                        file=file, line=line)
    if field is None:
        for key in ("conversations", "messages"):
            if isinstance(obj.get(key), list):
                return _chat(obj[key], file=file, line=line)
    keys = ", ".join(sorted(obj)) or "none"
    raise UserError(f"record has no field {name!r}" + ("" if field else " nor conversations/messages")
                    + f" (keys: {keys})", file=file, line=line,
                    fix="set `field:` on the dataset to the record's text field")


def _chat(turns: list[Any], *, file: str, line: int | None) -> list[Message]:
    messages: list[Message] = []
    for turn in turns:
        if isinstance(turn, dict) and "role" in turn and "content" in turn:
            role, content = str(turn["role"]), turn["content"]
        elif isinstance(turn, dict) and "from" in turn and "value" in turn:
            role, content = _SHAREGPT_ROLES.get(str(turn["from"]), str(turn["from"])), turn["value"]
        else:
            raise UserError("chat turn needs role/content or from/value", file=file, line=line)
        if not isinstance(content, str):
            raise UserError(f"chat content is {type(content).__name__}, expected a string",
                            file=file, line=line)
        messages.append({"role": role, "content": content})
    if not messages:
        raise UserError("empty chat", file=file, line=line)
    return messages


def _hf_records(source: TextSource, split: Split, base_dir: Path | None) -> list[Record]:
    # Offline before the first import: datasets reads these flags at import time.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError as exc:
        raise UserError(f"Hugging Face dataset source needs the `datasets` package ({exc})",
                        field="dataset", fix="pip install -r requirements.txt") from None

    name = source.hf
    assert name is not None
    if base_dir is not None and (Path(base_dir) / name).is_dir():
        name = str(Path(base_dir) / name)  # a dataset directory next to the recipe
    wanted = [source.split] if source.split else (
        ["train"] if split == "train" else ["validation", "test", "train"])
    # The flags above only count if datasets was not imported before; set its config as well.
    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()  # "Using the latest cached version..." on every load
    datasets.disable_progress_bars()
    try:
        loaded = datasets.load_dataset(name, source.config)
    except Exception as exc:  # datasets raises several types for "not cached"; all mean the same here
        raise UserError(f"Hugging Face dataset {name!r} is not in the local cache "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
                        field="dataset",
                        fix="download it once with network access, or use a local .jsonl file") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    chosen = next((s for s in wanted if s in loaded), None)
    if chosen is None:
        raise UserError(f"Hugging Face dataset {name!r} has no split {' / '.join(wanted)} "
                        f"(it has: {', '.join(loaded)})", field="dataset.split")
    rows = loaded[chosen]
    if source.max_records is not None:
        rows = rows.select(range(min(source.max_records, len(rows))))
    return [_record(row, source.field, where=(f"hf:{name}[{chosen}]", i)) for i, row in enumerate(rows)]


def fingerprint(source: TextSource, *, base_dir: Path | None = None) -> dict[str, Any]:
    """Facts outside the recipe that change what the source yields (for stage cache keys)."""
    if source.kind == "file":
        path = source.resolved_path(base_dir)
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        return {"file_sha256": digest}
    if source.kind == "pydoc":
        import sys

        return {"python": f"{sys.version_info.major}.{sys.version_info.minor}"}  # pydoc topics vary
    return {}


# --------------------------------------------------------------------------------------------------
# Token windows


def joiner(source: TextSource, base_dir: Path | None = None) -> str | None:
    """How a source's records join into one token stream: paragraphs of one document (the pydoc
    corpus, a .txt file) by a blank line, as the text reads; separate records (.jsonl rows, dataset
    rows) by EOS (None), as distinct documents."""
    if source.kind == "pydoc" or (source.kind == "file" and source.resolved_path(base_dir).suffix == ".txt"):
        return "\n\n"
    return None


def token_stream(tokenizer: Any, texts: list[str], separator: str | None = None) -> list[int]:
    """All texts tokenized (no special tokens), in order: joined by `separator` as text, or by EOS
    between texts when `separator` is None."""
    if separator is not None:
        # verbose=False: a corpus is longer than model_max_length by design; windows are cut later.
        return list(tokenizer(separator.join(texts), add_special_tokens=False, verbose=False)["input_ids"])
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    for ids in encoded:
        stream.extend(ids)
        if eos is not None:
            stream.append(eos)
    return stream


def _bos_id(tokenizer: Any, bos: bool) -> int | None:
    return tokenizer.bos_token_id if bos and getattr(tokenizer, "bos_token_id", None) is not None else None


def _prefix(windows: torch.Tensor, bos_id: int | None) -> torch.Tensor:
    import torch

    if bos_id is None:
        return windows
    return torch.cat([torch.full((windows.shape[0], 1), bos_id, dtype=windows.dtype), windows], dim=1)


def token_windows(tokenizer: Any, texts: list[str], n: int, seq_len: int, seed: int, *,
                  bos: bool = False, separator: str | None = None) -> torch.Tensor:
    """`n` windows of `seq_len` tokens at random offsets of the token stream: LongTensor [n, seq_len].

    Deterministic for a given (texts, tokenizer, n, seq_len, seed): a private torch.Generator
    picks the offsets, so global RNG state does not matter. With `bos` (and a tokenizer that has a
    BOS token) each window is BOS + seq_len - 1 stream tokens, as a model sees text at inference.
    `separator`: see token_stream (`joiner(source)` gives the natural one).
    """
    import torch

    bos_id = _bos_id(tokenizer, bos)
    body = seq_len - (bos_id is not None)
    stream = torch.tensor(token_stream(tokenizer, texts, separator), dtype=torch.long)
    if stream.numel() < body:
        raise UserError(f"text source has {stream.numel()} tokens, fewer than seq_len={seq_len}",
                        field="seq_len", fix="use a smaller seq_len or more text")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - body + 1, (n,), generator=generator)
    return _prefix(torch.stack([stream[s: s + body] for s in starts.tolist()]), bos_id)


def sequential_windows(tokenizer: Any, texts: list[str], seq_len: int, n: int | None = None, *,
                       bos: bool = False, separator: str | None = None) -> torch.Tensor:
    """Consecutive non-overlapping windows from the start of the stream (for evaluation)."""
    import torch

    bos_id = _bos_id(tokenizer, bos)
    body = seq_len - (bos_id is not None)
    stream = torch.tensor(token_stream(tokenizer, texts, separator), dtype=torch.long)
    available = stream.numel() // body
    if available == 0:
        raise UserError(f"text source has {stream.numel()} tokens, fewer than seq_len={seq_len}",
                        field="seq_len", fix="use a smaller seq_len or more text")
    count = available if n is None else min(n, available)
    return _prefix(stream[: count * body].view(count, body), bos_id)
