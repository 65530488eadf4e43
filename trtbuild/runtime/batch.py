"""In-flight (continuous) batching: many sequences decoded together, joining and leaving at step
boundaries, each with its own sampler and its own speculator state.

Each step decodes every running sequence: speculators propose draft chains, one target forward
verifies all of them (each sequence at its own position, padded to the longest chain), each
sequence accepts the prefix of its drafts the target itself picks and gains one more token from
the target, and finished sequences leave, freeing their slot. Waiting sequences join at a step
with a free slot: their prompts go through that same target forward (`target_groups`: the GEMMs
see the prompt rows and the verification rows together, as TensorRT-LLM's mixed context and
generation batches), and each emits its first token at the end of that step. Joining costs the
running sequences one forward's worth of extra rows, not a step of their own.

Every token is the target's own choice at its position (argmax, or a draw from its sampling
distribution, `Sampler`), computed from the same arithmetic as single-stream decoding
(`trtbuild.runtime.batch_forward`), so greedy output equals `Generator.generate` token for token.

One sequence cannot fail the others: a prompt id outside the target's vocabulary is refused by
`add` (before it could reach the shared embedding lookup), and a sequence whose logits are not
finite or whose sampler fails leaves the batch alone, with an Event carrying its `error`; the
others' tokens are those they would have had without it.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from trtbuild.core.errors import UserError
from trtbuild.runtime.batch_forward import Layout, RowGroup, target_groups
from trtbuild.runtime.batch_kv import BatchKV
from trtbuild.runtime.sampling import Sampler, SamplingParams
from trtbuild.runtime.speculator import Speculator
from trtbuild.runtime.stats import DecodeStats
from trtbuild.runtime.target import TargetModel


@dataclass(eq=False)
class Sequence:
    id: int
    prompt_len: int
    tokens: list[int]  # prompt + emitted; the last one is not yet in the target's cache
    max_new: int
    sampler: Sampler
    eos: frozenset[int]
    speculator: Speculator | None
    stats: DecodeStats
    t0: float  # when it was added (its TTFT includes the wait for a free slot)
    length: int = 0  # target cache rows committed
    done: bool = False
    cancelled: bool = False
    emitted: list[int] = field(default_factory=list)  # the tokens handed out (cut at EOS / budget)
    error: str | None = None  # why it failed alone (non-finite logits, a sampler error)


@dataclass
class Event:
    seq: Sequence
    tokens: list[int]  # new tokens of this step (may be empty for a cancelled sequence)
    finished: bool
    error: str | None = None  # set when this sequence failed (alone); finished is then True


class BatchDecoder:
    """max_batch: sequences decoded together. prefill_tokens: prompt tokens that join one step (at
    least one sequence; more wait for the next step, so a burst of arrivals does not stall the
    running sequences behind one long prefill). speculate_up_to: speculators propose only while at
    most this many sequences decode (a batch of plain rows already keeps a compute-bound device
    busy; None: always). draft_len_schedule: {batch size: draft length} with TensorRT-LLM's meaning
    (llm_args.py@0004396, DecodingBaseConfig.draft_len_schedule): each key is the upper end of a band,
    so {4: 5, 8: 3} drafts up to 5 tokens per sequence while 1-4 sequences decode, 3 for 5-8, and
    none above 8; None: the speculators' own length at every size. Verification rows grow with
    the batch while acceptance per row falls with the draft position, so on a compute-bound device
    the best length shrinks as the batch grows."""

    def __init__(self, target: TargetModel, max_batch: int, *, prefill_tokens: int = 128,
                 speculate_up_to: int | None = None, draft_len_schedule: Mapping[int, int] | None = None) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.target = target
        self.max_batch = max_batch
        self.prefill_tokens = prefill_tokens
        self.speculate_up_to = speculate_up_to
        self.draft_len_schedule = dict(draft_len_schedule or {})
        s = target.spec
        self.kv = BatchKV(s.num_layers, max_batch, s.num_kv_heads, s.head_dim, target.dtype, target.device)
        self.running: list[Sequence] = []  # slot order: running[i] occupies slot i
        self.waiting: deque[Sequence] = deque()
        self._ids = itertools.count()

    # -- requests ----------------------------------------------------------------------------

    def add(self, prompt: Seq[int] | torch.Tensor, max_new_tokens: int, *,
            sampling: SamplingParams | None = None, speculator: Speculator | None = None,
            eos_token_ids: Seq[int] | None = None, draft_slack: int = 0) -> Sequence:
        """Queues a sequence; it joins the batch at the next step with a free slot.

        draft_slack: the longest draft its speculator proposes (positions reserved past the budget)."""
        ids = [int(t) for t in torch.as_tensor(prompt).reshape(-1).tolist()]
        if not ids:
            raise UserError("empty prompt")
        vocab = self.target.spec.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:  # an embedding lookup out of range would fail the whole batch's forward
            raise UserError(f"prompt token id {bad} is outside the model's vocabulary [0, {vocab}) "
                            "(a tokenizer that does not match the model?)")
        if max_new_tokens < 1:
            raise UserError("max_new_tokens must be at least 1")
        if len(ids) + max_new_tokens + draft_slack + 1 > self.target.max_positions:
            raise UserError(f"prompt ({len(ids)}) + max_new_tokens ({max_new_tokens}) exceed the "
                            f"model's {self.target.max_positions} positions")
        eos = self.target.spec.eos_token_ids if eos_token_ids is None else eos_token_ids
        sampling = sampling or SamplingParams()
        seq = Sequence(id=next(self._ids), prompt_len=len(ids), tokens=ids, max_new=max_new_tokens,
                       sampler=Sampler(sampling, self.target.device), eos=frozenset(eos), speculator=speculator,
                       stats=DecodeStats(prompt_tokens=len(ids)), t0=time.perf_counter())
        self.waiting.append(seq)
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Stops a sequence; it leaves the batch at the next step (an Event with finished=True)."""
        seq.cancelled = True

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- steps -------------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """Decodes the running sequences once; waiting ones join that same forward if a slot is free."""
        # Leaving the batch rewrites the KV cache, an inference tensor: only allowed in this mode.
        with torch.inference_mode():
            events = self._drop_cancelled()
            new = self._take_waiting()
            if self.running:
                events += self._decode(new)
            elif new:
                events += self._admit(new)
        return events

    def _take_waiting(self) -> list[Sequence]:
        """The waiting sequences that join at this step: as many as there are free slots, up to
        prefill_tokens prompt tokens (at least one)."""
        room = self.max_batch - len(self.running)
        if not self.waiting or room < 1:
            return []
        new = [self.waiting.popleft()]
        tokens = new[0].prompt_len
        while self.waiting and len(new) < room and tokens + self.waiting[0].prompt_len <= self.prefill_tokens:
            tokens += self.waiting[0].prompt_len
            new.append(self.waiting.popleft())
        return new

    def draft_len(self, batch: int) -> int | None:
        """Most draft tokens per sequence while `batch` sequences decode (0: none; None: no limit):
        the value of the smallest schedule key >= batch, 0 above every key."""
        if self.speculate_up_to is not None and batch > self.speculate_up_to:
            return 0
        if not self.draft_len_schedule:
            return None
        sizes = [size for size in self.draft_len_schedule if size >= batch]
        return self.draft_len_schedule[min(sizes)] if sizes else 0

    def _drop_cancelled(self) -> list[Event]:
        events = []
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            seq.done = True
            events.append(Event(seq, [], True))
        for seq in [s for s in self.running if s.cancelled]:
            if seq.speculator is not None:
                seq.speculator.release(seq)
            self._leave(seq)
            seq.done = True
            events.append(Event(seq, [], True))
        return events

    def _aux_layers(self, seqs: Seq[Sequence]) -> tuple[int, ...]:
        return tuple(sorted({i for s in seqs if s.speculator is not None for i in s.speculator.aux_layers}))

    @staticmethod
    def _aux_for(speculator: Speculator, layers: tuple[int, ...], aux: torch.Tensor | None,
                 rows: list[int]) -> torch.Tensor | None:
        """The speculator's own aux layers (in layer order) of the given batch rows."""
        if aux is None or not speculator.aux_layers:
            return None
        picked = aux[torch.tensor(rows, device=aux.device)]
        if tuple(speculator.aux_layers) == layers or sorted(speculator.aux_layers) == list(layers):
            return picked
        parts = picked.chunk(len(layers), -1)
        return torch.cat([parts[layers.index(i)] for i in sorted(speculator.aux_layers)], -1)

    def _groups(self, seqs: Seq[Sequence]) -> list[tuple[Speculator, list[int]]]:
        groups: dict[int, tuple[Speculator, list[int]]] = {}
        for i, seq in enumerate(seqs):
            if seq.speculator is not None:
                groups.setdefault(id(seq.speculator), (seq.speculator, []))[1].append(i)
        return list(groups.values())

    def _prefill_group(self, new: list[Sequence]) -> RowGroup:
        """The new sequences' prompts, in the slots after the running ones (logits at each last row)."""
        lo = len(self.running)
        width = max(seq.prompt_len for seq in new)
        device = self.target.device
        ids = torch.zeros(len(new), width, dtype=torch.long, device=device)
        for i, seq in enumerate(new):
            ids[i, : seq.prompt_len] = torch.tensor(seq.tokens)
        lengths = torch.tensor([seq.prompt_len for seq in new], device=device)
        self.kv.ensure(width)
        layout = Layout.causal(torch.zeros_like(lengths), width, self.target.max_positions)
        return RowGroup(ids, self.kv.view(lo, lo + len(new)), layout, last=lengths - 1)

    def _admit(self, new: list[Sequence]) -> list[Event]:
        """A step with nothing running: the new prompts alone."""
        layers = self._aux_layers(new)
        t0 = time.perf_counter()
        [(logits, aux)] = target_groups(self.target, [self._prefill_group(new)], aux_layers=layers)
        self._join(new)
        return self._start(new, logits, aux, layers, time.perf_counter() - t0)

    def _join(self, new: list[Sequence]) -> None:
        """Prefilled sequences join the running list: their slots follow the running ones'
        (`_prefill_group`), and their prompts are committed (a slot move copies `length` rows)."""
        for seq in new:
            seq.length = seq.prompt_len
        self.running.extend(new)

    def _start(self, new: list[Sequence], logits: torch.Tensor, aux: torch.Tensor | None, layers: tuple[int, ...],
               elapsed: float) -> list[Event]:
        """New sequences, prefilled (logits [N, 1, V] at their last prompt rows) and already in the
        running list: each emits its first token and its speculator takes it in."""
        events = []
        top, best = logits.max(-1)
        finite, greedy = torch.isfinite(top).tolist(), best.tolist()
        for i, seq in enumerate(new):
            picked = self._pick(seq, logits[i, :1], finite[i], greedy[i])
            if picked is None:
                events.append(Event(seq, [], True, seq.error))
                continue
            token = picked[0]
            seq.tokens.append(token)
            seq.stats.target_forwards += 1
            seq.stats.target_s += elapsed
            events.append(Event(seq, self._emit(seq, [token]), seq.done))
        for speculator, rows in self._groups(new):
            live = [i for i in rows if new[i].error is None]
            if live:
                speculator.admit([new[i] for i in live], self._aux_for(speculator, layers, aux, live))
        for seq in new:
            if seq.error is not None:
                self._leave(seq)  # never admitted by its speculator: nothing to release there
            elif seq.done:
                self._finish(seq)
        return events

    def _pick(self, seq: Sequence, logits: torch.Tensor, finite: list[bool], greedy: list[int]) -> list[int] | None:
        """The target's tokens for the sequence's rows (logits [k+1, V]; `greedy` their argmax), or None
        when it fails alone: a row whose largest logit is not finite (a NaN anywhere in the row, +inf,
        or all -inf), or a sampler that raises (its error is recorded, it is done)."""
        if not all(finite):
            return self._fail(seq, "the model's logits for this request are not finite (NaN or inf)")
        if seq.sampler.params.greedy:
            return greedy
        try:
            return [int(t) for t in seq.sampler(logits).reshape(-1).tolist()]
        except (RuntimeError, ValueError) as exc:
            return self._fail(seq, f"sampling failed: {str(exc).splitlines()[0][:200]}")

    @staticmethod
    def _fail(seq: Sequence, why: str) -> None:
        seq.error = why
        seq.done = True
        return None

    def _decode(self, new: list[Sequence]) -> list[Event]:
        """One step of the running sequences (drafts verified), with the new ones' prefill in the same
        target forward."""
        seqs = list(self.running)
        drafts: list[list[int]] = [[] for _ in seqs]
        t0 = time.perf_counter()
        limit = self.draft_len(len(seqs))
        for speculator, rows in self._groups(seqs) if limit != 0 else []:
            for i, proposal in zip(rows, speculator.propose([seqs[i] for i in rows], limit), strict=True):
                # never past the context: the last verified row must have a RoPE position
                drafts[i] = list(proposal[: self.target.max_positions - 1 - seqs[i].length])
        t1 = time.perf_counter()
        width = 1 + max(len(d) for d in drafts)
        device = self.target.device
        ids = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
        for i, (seq, draft) in enumerate(zip(seqs, drafts, strict=True)):
            ids[i, : len(draft) + 1] = torch.tensor([seq.tokens[-1], *draft])
        starts = torch.tensor([seq.length for seq in seqs], device=device)
        self.kv.ensure(int(starts.max()) + width)
        layers = self._aux_layers(seqs + new)
        prefill = [self._prefill_group(new)] if new else []  # first: it may grow the cache, which views point into
        groups = [RowGroup(ids, self.kv.view(0, len(seqs)), Layout.causal(starts, width, self.target.max_positions)),
                  *prefill]
        results = target_groups(self.target, groups, aux_layers=layers)
        logits, aux = results[0]
        self._join(new)
        t2 = time.perf_counter()
        # max, not argmax: the same first index of the largest logit, and its value tells, at no extra
        # pass over the vocabulary, whether the row holds a NaN (max propagates it) or an inf.
        top, best = logits.max(-1)
        greedy, finite = best.tolist(), torch.isfinite(top).tolist()
        accepted, events = [], []
        for i, (seq, draft) in enumerate(zip(seqs, drafts, strict=True)):
            k = len(draft)
            picks = self._pick(seq, logits[i, : k + 1], finite[i][: k + 1], greedy[i][: k + 1])
            if picks is None:  # failed alone: it leaves below, like a finished sequence
                accepted.append(0)
                events.append(Event(seq, [], True, seq.error))
                continue
            a = 0
            while a < k and draft[a] == picks[a]:
                a += 1
            taken = [*draft[:a], picks[a]]
            seq.length += a + 1
            seq.tokens.extend(taken)
            seq.stats.target_forwards += 1
            seq.stats.target_s += t2 - t1
            seq.stats.draft_s += t1 - t0
            if seq.speculator is not None:
                seq.stats.accepted.append(a)
            accepted.append(a)
            events.append(Event(seq, self._emit(seq, taken), seq.done))
        for speculator, rows in self._groups(seqs):
            for i in rows:
                if seqs[i].done:
                    speculator.release(seqs[i])
            live = [i for i in rows if not seqs[i].done]
            if live:
                speculator.update([seqs[i] for i in live], [accepted[i] for i in live],
                                  self._aux_for(speculator, layers, aux, live))
        t3 = time.perf_counter()
        for seq in seqs:
            seq.stats.draft_s += t3 - t2
            if seq.done:
                self._leave(seq)
        if new:
            events += self._start(new, *results[1], layers, t2 - t1)
        return events

    # -- bookkeeping -------------------------------------------------------------------------

    def _emit(self, seq: Sequence, new: list[int]) -> list[int]:
        """Cuts `new` at EOS / the token budget and records it (as `Decoding._emit`)."""
        new, done = seq.stats.record(new, seq.max_new, seq.eos, seq.t0)
        seq.emitted.extend(new)
        seq.done = done
        return new

    def _finish(self, seq: Sequence) -> None:
        if seq.speculator is not None:
            seq.speculator.release(seq)
        self._leave(seq)

    def _leave(self, seq: Sequence) -> None:
        """Frees the sequence's slot: the last running sequence moves into it."""
        slot = self.running.index(seq)
        last = len(self.running) - 1
        if slot != last:
            moved = self.running[last]
            self.kv.move(last, slot, moved.length)
            self.running[slot] = moved
        self.running.pop()
