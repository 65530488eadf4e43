"""Text in, text out around the project's runtime: tokenize, decode (plain or EAGLE-3), detokenize.

The local Triton model and `bench_server`'s in-process baseline both go through this class, so
the server adds nothing but the server. Streaming yields text deltas whose concatenation is
exactly the text of the whole generation: a delta is only released when the decoded text of all
tokens so far extends what was already sent and does not end in an incomplete UTF-8 sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trtbuild.core.errors import UserError
from trtbuild.core.pbtxt import parameters_of, parse_config

# How token ids become text, everywhere (server, baseline, tests).
DECODE_KWARGS = {"clean_up_tokenization_spaces": False}
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class GenRequest:
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    speculative: bool | None = None  # None: whatever the generator was set up with


@dataclass
class Chunk:
    ids: list[int]
    text: str  # may be "" while a multi-byte character is incomplete


@dataclass
class Result:
    text: str
    ids: list[int]
    stats: Any = None  # trtbuild.runtime.DecodeStats
    chunks: list[Chunk] = field(default_factory=list)


class TextDeltas:
    """Token ids arriving in chunks -> text deltas whose concatenation is the text of all of them.

    A delta is released only when the decoded text of all tokens so far extends what was already
    sent and does not end in an incomplete UTF-8 sequence; `finish` releases what is left."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.sent = ""

    def add(self, new: list[int]) -> str:
        self.ids.extend(new)
        text = self.decode(self.ids)
        if text.startswith(self.sent) and not text.endswith(REPLACEMENT):
            delta, self.sent = text[len(self.sent):], text
            return delta
        return ""

    def finish(self) -> str:
        final = self.decode(self.ids)
        if final != self.sent and final.startswith(self.sent):
            delta, self.sent = final[len(self.sent):], final
            return delta
        return ""


class TextGenerator:
    """Loads the target (and the draft) once; decodes requests one at a time (`TextBatcher`
    decodes many of them together with the same models)."""

    def __init__(self, target_dir: Path, *, draft_dir: Path | None = None, tokenizer_dir: Path | None = None,
                 add_special_tokens: bool = True, skip_special_tokens: bool = True,
                 speculation: Literal["chain", "tree"] = "chain", max_draft_len: int | None = None,
                 max_total_draft_tokens: int | None = None, num_threads: int | None = None) -> None:
        import torch
        from transformers import AutoTokenizer

        from trtbuild.runtime import Generator, SpecParams, load_draft, load_target

        for what, directory in (("target", target_dir), ("draft", draft_dir), ("tokenizer", tokenizer_dir)):
            if directory is not None and not Path(directory).is_dir():
                raise UserError(f"{what} directory not found: {directory}",
                                fix="rebuild the deployment (trtbuild deploy RECIPE --force deploy)")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or target_dir))
        self.add_special_tokens = add_special_tokens
        self.skip_special_tokens = skip_special_tokens
        target = load_target(Path(target_dir))
        draft = load_draft(Path(draft_dir), target) if draft_dir else None
        self.generator = Generator(target, draft)
        self.spec = None
        if draft is not None:
            values: dict[str, Any] = {"max_draft_len": max_draft_len or 3, "mode": speculation}
            if speculation == "tree" and max_total_draft_tokens:
                values["max_total_draft_tokens"] = max_total_draft_tokens
            self.spec = SpecParams(**values)

    @property
    def speculative(self) -> bool:
        return self.spec is not None

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt, add_special_tokens=self.add_special_tokens)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens, **DECODE_KWARGS)

    def prepare(self, request: GenRequest) -> tuple[list[int], Any, Any]:
        """(prompt ids, SamplingParams, SpecParams or None) of a request; bad ones raise UserError."""
        from trtbuild.runtime import SamplingParams

        ids = self.encode(request.prompt)
        if not ids:
            raise UserError("the prompt is empty after tokenization", field="text_input")
        spec = self.spec if request.speculative is not False else None
        if request.speculative and self.spec is None:
            raise UserError("speculative decoding was asked for but this deployment has no draft",
                            field="speculative")
        sampling = SamplingParams(temperature=request.temperature, top_k=request.top_k, top_p=request.top_p,
                                  seed=request.seed)
        return ids, sampling, spec

    def _decoding(self, request: GenRequest) -> Any:
        ids, sampling, spec = self.prepare(request)
        return self.generator.stream(ids, request.max_tokens, sampling=sampling, spec=spec)

    def stream(self, request: GenRequest) -> Iterator[Chunk]:
        """Chunks as the runtime emits them (one per decode step: several tokens when drafts are accepted).

        The iterator's `stats` attribute is not reachable through a generator, so the final
        DecodeStats are returned as the generator's value (StopIteration.value)."""
        run = self._decoding(request)
        deltas = TextDeltas(self.decode)
        for new in run:
            yield Chunk(list(new), deltas.add(new))
        rest = deltas.finish()
        if rest:
            yield Chunk([], rest)
        return run.stats

    def generate(self, request: GenRequest) -> Result:
        chunks: list[Chunk] = []
        stream = self.stream(request)
        while True:
            try:
                chunks.append(next(stream))
            except StopIteration as stop:
                stats = stop.value
                break
        ids = [i for c in chunks for i in c.ids]
        return Result(text=self.decode(ids), ids=ids, stats=stats, chunks=chunks)


def prompt_byte_limit(tokenizer: Any, positions: int, configured: int) -> int:
    """The most bytes a prompt that fits the model's context can have: its positions times the
    longest token's UTF-8 length (a token's string is never shorter than the text it stands for),
    capped by the deployment's `max_prompt_bytes`. Longer prompts are refused before tokenizing."""
    longest = max((len(token.encode("utf-8", "replace")) for token in tokenizer.get_vocab()), default=1)
    return max(1, min(configured, positions * max(longest, 1)))


def generator_from_params(params: dict[str, str], model_dir: Path) -> TextGenerator:
    """The generator a local model's config.pbtxt parameters describe (paths relative to the model dir).

    The Triton model and the in-process baseline of the load test both build theirs here."""

    def path(key: str) -> Path | None:
        value = params.get(key, "")
        return (model_dir / value).resolve() if value else None

    def number(key: str) -> int | None:
        value = params.get(key, "")
        return int(value) if value else None

    return TextGenerator(
        path("target_dir"), draft_dir=path("draft_dir") if params.get("speculative") == "true" else None,
        tokenizer_dir=path("tokenizer_dir"), add_special_tokens=params.get("add_special_tokens") == "true",
        skip_special_tokens=params.get("skip_special_tokens") == "true",
        speculation=params.get("speculation", "chain"),  # type: ignore[arg-type]
        max_draft_len=number("max_draft_len"), max_total_draft_tokens=number("max_total_draft_tokens"),
        num_threads=number("num_threads"))


def generator_for_model(model_dir: Path) -> TextGenerator:
    """Build the generator of a local repository's model directory from its config.pbtxt."""
    return generator_from_params(parameters_of(parse_config(model_dir / "config.pbtxt")), model_dir)
