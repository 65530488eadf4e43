"""Text requests decoded together: `TextGenerator`'s tokenizer and models behind the runtime's
in-flight batch decoder (`trtbuild.runtime.batch`).

Requests are submitted with a tag (whatever the caller identifies them by); every `step` returns
the text chunks the step produced, per tag, with the same streaming rule as `TextGenerator.stream`
(deltas that concatenate to the text of the whole generation). Greedy outputs are those of
`TextGenerator.generate` for the same request, token for token.

Speculation: the deployment's EAGLE-3 draft proposes chains of max_draft_len tokens, one state
per sequence. A `tree` deployment is drafted as a chain of the same depth here (batched tree
verification is not implemented); output is the same either way, only the speed differs.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from trtbuild.serve.textgen import Chunk, GenRequest, TextDeltas, TextGenerator


def speculator_for(generator: TextGenerator, max_batch: int) -> Any:
    """The batch's speculator (trtbuild.runtime.speculator.Speculator) for the deployment's
    speculation settings, or None. Another kind of speculator (n-gram / prompt lookup) is chosen here."""
    if generator.spec is None:
        return None
    from trtbuild.runtime.batch_eagle3 import Eagle3ChainSpeculator

    draft = generator.generator.draft
    assert draft is not None
    return Eagle3ChainSpeculator(draft, generator.spec.max_draft_len, max_batch, generator.spec.min_draft_prob)


@dataclass
class TextEvent:
    tag: Hashable
    chunk: Chunk
    finished: bool
    result_text: str | None = None  # the whole generation's text, with the final event
    result_ids: list[int] | None = None
    error: str | None = None  # this request failed alone (the others go on); finished is True


class TextBatcher:
    def __init__(self, generator: TextGenerator, max_batch: int, speculate_up_to: int | None = None,
                 draft_len_schedule: dict[int, int] | None = None) -> None:
        self.text = generator
        self.max_batch = max_batch
        self.speculate_up_to = speculate_up_to
        self.draft_len_schedule = draft_len_schedule
        self.draft_len = generator.spec.max_draft_len if generator.spec is not None else 0
        self._fresh()

    def _fresh(self) -> None:
        from trtbuild.runtime.batch import BatchDecoder

        self.decoder = BatchDecoder(self.text.generator.target, self.max_batch, speculate_up_to=self.speculate_up_to,
                                    draft_len_schedule=self.draft_len_schedule)
        self.speculator = speculator_for(self.text, self.max_batch)
        self._live: dict[Hashable, tuple[Any, TextDeltas]] = {}

    @property
    def idle(self) -> bool:
        return self.decoder.idle

    @property
    def tags(self) -> list[Hashable]:
        return list(self._live)

    def submit(self, request: GenRequest, tag: Hashable, prepared: tuple[list[int], Any, Any] | None = None) -> None:
        """Queues a request (bad ones raise UserError before anything is queued). `prepared` is
        `TextGenerator.prepare(request)` done elsewhere (the server tokenizes off the decode thread)."""
        if tag in self._live:
            raise ValueError(f"tag {tag!r} is already decoding")
        ids, sampling, spec = prepared or self.text.prepare(request)
        speculator = self.speculator if spec is not None else None
        seq = self.decoder.add(ids, request.max_tokens, sampling=sampling, speculator=speculator,
                               draft_slack=self.draft_len if speculator else 0)
        self._live[tag] = (seq, TextDeltas(self.text.decode))

    def cancel(self, tag: Hashable) -> None:
        if tag in self._live:
            self.decoder.cancel(self._live[tag][0])

    def step(self) -> list[TextEvent]:
        by_seq = {seq.id: tag for tag, (seq, _) in self._live.items()}
        events = []
        for event in self.decoder.step():
            tag = by_seq[event.seq.id]
            deltas = self._live[tag][1]
            if event.error is not None:
                del self._live[tag]
                events.append(TextEvent(tag, Chunk([], ""), True, error=event.error))
                continue
            chunk = Chunk(list(event.tokens), deltas.add(event.tokens))
            if not event.finished:
                events.append(TextEvent(tag, chunk, False))
                continue
            rest = deltas.finish()
            chunk.text += rest
            del self._live[tag]
            events.append(TextEvent(tag, chunk, True, self.text.decode(deltas.ids), list(deltas.ids)))
        return events

    def reset(self) -> list[Hashable]:
        """Drops every request (after a failed step); returns their tags."""
        tags = list(self._live)
        self._fresh()
        return tags
