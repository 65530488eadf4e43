"""Triton python-backend model serving the project's runtime (copied into the repository as model.py).

Protocol (KServe v2 tensors, also reachable through the generate / generate_stream extension):
  inputs   text_input (BYTES, one prompt per request), and optional max_tokens (INT32),
           temperature (FP32, 0 = greedy), top_k (INT32), top_p (FP32), seed (UINT64),
           stream (BOOL: one response per decode step), speculative (BOOL: use the EAGLE-3 draft)
  outputs  text_output (BYTES: the generated text, or this step's piece of it when streaming),
           output_ids (INT32: the token ids of the same span)
Decoupled (the default), requests go to a decode thread that batches them in flight, as
TensorRT-LLM's executor does: up to max_batch_size requests decode together, a new one joins at
the next step boundary (its prefill gives its first token), a finished or cancelled one leaves,
and each keeps its own sampler and speculative state (trtbuild.runtime.batch). With `stream` it
gets a response per decode step, else one response with all the text (what /generate needs).
Without the decoupled policy, `execute` decodes the requests it is handed together and answers them.
Bad values are answered with INVALID_ARG, which HTTP clients see as a 400 with the message: a
value of the wrong type too, and a prompt over the byte limit (checked on the raw bytes, before
decoding or tokenizing): `max_prompt_bytes`, or less when the model's context cannot hold that
many bytes (positions x the longest token, textgen.prompt_byte_limit); a prompt whose tokens and
max_tokens exceed the context is refused once tokenized. Requests are parsed and tokenized on a
thread of their own, so a long prompt never stalls the decode steps of the others. Every request,
streaming or not, is checked for cancellation every
CANCEL_CHECK_S, so an abandoned one leaves the batch. On shutdown the server creates the file named
by TRTBUILD_DRAIN_FILE when the drain time is up: requests in flight end then (streams with their
last piece sent, others with UNAVAILABLE), new ones are answered UNAVAILABLE.

The model's parameters (config.pbtxt) name the bundle's directories relative to this model's
directory; the runtime and transformers come from the environment the stub runs in.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

CANCEL_CHECK_S = 0.05  # a cancelled stream stops within one decode step of this
DEFAULT_MAX_PROMPT_BYTES = 1 << 20
_KINDS = {int: "iu", float: "iuf", bool: "b"}  # numpy dtype kinds each Python type accepts

# The stub's embedded interpreter ignores PYTHONPATH, where the launcher (server.server_env) names
# the trtbuild that started the server; without this an editable install elsewhere would win.
for _entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    if _entry and _entry not in sys.path:
        sys.path.insert(0, _entry)


class BadRequest(Exception):
    """A request the model refuses (HTTP 400)."""


def _scalar(request: Any, name: str, kind: type, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise BadRequest(f"{name} must be a single value, got {values.size}")
    if values.dtype.kind not in _KINDS.get(kind, values.dtype.kind):
        raise BadRequest(f"{name} must be {'a boolean' if kind is bool else 'a number'}, got {values.dtype}")
    try:
        value = kind(values[0])
    except (TypeError, ValueError, OverflowError):
        raise BadRequest(f"{name}: {values[0]!r} is not a valid {kind.__name__}") from None
    if kind is float and value != value:
        raise BadRequest(f"{name} must be a number, got NaN")
    return value


def draining() -> bool:
    """True once the server's drain time is up (see the module docstring)."""
    flag = os.environ.get("TRTBUILD_DRAIN_FILE")
    return bool(flag) and os.path.exists(flag)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        from trtbuild.serve.textbatch import TextBatcher
        from trtbuild.serve.textgen import generator_from_params

        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        model_dir = Path(args["model_repository"])
        max_batch_size = int(config.get("max_batch_size", 0))
        self.batched = max_batch_size > 0
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.default_max_tokens = int(params["default_max_tokens"])
        self.max_tokens_limit = int(params["max_tokens_limit"])
        self.generator = generator_from_params(params, model_dir)
        from trtbuild.serve.textgen import prompt_byte_limit

        self.max_prompt_bytes = prompt_byte_limit(self.generator.tokenizer, self.generator.generator.target.max_positions,
                                                  int(params.get("max_prompt_bytes") or DEFAULT_MAX_PROMPT_BYTES))
        speculate_up_to = int(params["speculative_max_batch"]) if params.get("speculative_max_batch") else None
        schedule = {int(size): int(n) for size, n in json.loads(params.get("draft_len_schedule") or "{}").items()}
        self.batcher = TextBatcher(self.generator, max(1, max_batch_size), speculate_up_to, schedule or None)
        self._tags = itertools.count()
        self._warm_up()
        self.incoming: queue.Queue[Any] = queue.Queue()  # requests, to parse and tokenize
        self.work: queue.Queue[Any] = queue.Queue()  # (sender, prepared request or BadRequest), to decode
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.preparing = threading.Thread(target=self._prepare_loop, name="trtbuild-tokenize", daemon=True)
        self.preparing.start()
        self.worker = threading.Thread(target=self._loop, name="trtbuild-decode", daemon=True)
        self.worker.start()
        self.sending = threading.Thread(target=self._send_loop, name="trtbuild-send", daemon=True)
        self.sending.start()
        import torch

        pb_utils.Logger.log_info(f"trtbuild local model ready (speculative: {self.generator.speculative}, "
                                 f"in-flight batch: {self.batcher.max_batch}, "
                                 f"torch threads: {torch.get_num_threads()})")

    def _warm_up(self) -> None:
        """A short batch so the first real requests do not pay for lazy initialisation."""
        from trtbuild.serve.textgen import GenRequest

        for i in range(self.batcher.max_batch):
            self.batcher.submit(GenRequest(prompt="def" * (i + 1), max_tokens=4), ("warm-up", i))
        while not self.batcher.idle:
            self.batcher.step()

    # -- requests --------------------------------------------------------------------------
    def parse(self, request: Any) -> tuple[Any, bool]:
        from trtbuild.serve.textgen import GenRequest

        tensor = pb_utils.get_input_tensor_by_name(request, "text_input")
        if tensor is None:
            raise BadRequest("text_input is required (the prompt)")
        prompts = tensor.as_numpy().reshape(-1)
        if prompts.size != 1:
            raise BadRequest(f"send one prompt per request (got {prompts.size})")
        raw = prompts[0]
        size = len(raw) if isinstance(raw, bytes | str) else 0
        if size > self.max_prompt_bytes:
            raise BadRequest(f"text_input is {size} bytes; this deployment takes at most {self.max_prompt_bytes}")
        if not isinstance(raw, bytes | str):
            raise BadRequest("text_input must be a string")
        try:
            prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            raise BadRequest("text_input is not valid UTF-8") from None
        if not prompt:
            raise BadRequest("text_input is empty")
        max_tokens = _scalar(request, "max_tokens", int, self.default_max_tokens)
        if not 1 <= max_tokens <= self.max_tokens_limit:
            raise BadRequest(f"max_tokens must be between 1 and {self.max_tokens_limit}, got {max_tokens}")
        temperature = _scalar(request, "temperature", float, 0.0)
        top_k = _scalar(request, "top_k", int, 0)
        top_p = _scalar(request, "top_p", float, 1.0)
        if not temperature >= 0.0:
            raise BadRequest(f"temperature must be >= 0, got {temperature}")
        if top_k < 0:
            raise BadRequest(f"top_k must be >= 0, got {top_k}")
        if not 0.0 < top_p <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {top_p}")
        seed = _scalar(request, "seed", int, None)
        speculative = _scalar(request, "speculative", bool, None)
        stream = _scalar(request, "stream", bool, False)
        gen = GenRequest(prompt=prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, seed=seed, speculative=speculative)
        return gen, stream

    def response(self, text: str, ids: list[int]) -> Any:
        texts = np.array([text.encode("utf-8")], dtype=np.object_)
        tokens = np.array(ids, dtype=np.int32)
        if self.batched:
            texts, tokens = texts.reshape(1, 1), tokens.reshape(1, -1)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", texts),
                                                          pb_utils.Tensor("output_ids", tokens)])

    @staticmethod
    def error(message: str, bad_request: bool, code: Any = None) -> Any:
        if code is None:
            code = pb_utils.TritonError.INVALID_ARG if bad_request else pb_utils.TritonError.INTERNAL
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))

    def unavailable(self, message: str) -> Any:
        return self.error(message, False, getattr(pb_utils.TritonError, "UNAVAILABLE", None))

    def answer_together(self, requests: list[Any]) -> list[Any]:
        """Non-decoupled: the requests of one execute call, decoded as one in-flight batch."""
        from trtbuild.core.errors import UserError

        responses: list[Any] = [None] * len(requests)
        for index, request in enumerate(requests):
            try:
                gen, _ = self.parse(request)
                self.batcher.submit(gen, index)
            except (BadRequest, UserError) as exc:
                responses[index] = self.error(str(exc), bad_request=True)
        try:
            while not self.batcher.idle:
                for event in self.batcher.step():
                    if event.error is not None:  # this request alone failed
                        responses[event.tag] = self.error(f"generation failed: {event.error}", bad_request=False)
                    elif event.finished:
                        responses[event.tag] = self.response(event.result_text or "", event.result_ids or [])
        except Exception as exc:  # a failed batch must not take the model down
            pb_utils.Logger.log_error(traceback.format_exc())
            for index in self.batcher.reset():
                responses[index] = self.error(f"generation failed: {exc}", bad_request=False)
        return responses

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if not self.decoupled:
            return self.answer_together(requests)
        for request in requests:
            self.incoming.put(request)
        return None

    def _prepare_loop(self) -> None:
        """Parses and tokenizes requests off the decode thread (which only adds them to the batch)."""
        from trtbuild.core.errors import UserError

        while True:
            request = self.incoming.get()
            if request is None:
                self.work.put(None)
                return
            sender = request.get_response_sender()
            try:
                gen, stream = self.parse(request)
                prepared: Any = (gen, stream, self.generator.prepare(gen))
            except (BadRequest, UserError) as exc:
                prepared = exc
            except Exception as exc:  # a tokenizer failure is this request's, not the model's
                pb_utils.Logger.log_error(traceback.format_exc())
                prepared = BadRequest(f"the prompt could not be tokenized: {exc}")
            self.work.put((sender, prepared))

    # -- decoupled: the in-flight batch ------------------------------------------------------
    def _loop(self) -> None:
        active: dict[int, tuple[Any, bool]] = {}  # tag -> (response sender, streaming)
        cancelled: dict[int, str] = {}  # tag -> "" (its client left) or why the server cut it
        stopping = False
        checked = time.monotonic()
        while True:
            block = self.batcher.idle and not stopping  # wait for work only when nothing decodes
            while True:
                try:
                    request = self.work.get(block=block)
                except queue.Empty:
                    break
                block = False
                if request is None:
                    stopping = True
                    break
                self._start(request, active)
            if self.batcher.idle:
                if stopping:
                    return
                continue
            # is_cancelled() is a round trip to the server: ask every CANCEL_CHECK_S, not per step
            if time.monotonic() - checked >= CANCEL_CHECK_S:
                cut = draining()
                for tag, (sender, _) in active.items():
                    if tag in cancelled:
                        continue
                    if sender.is_cancelled():
                        cancelled[tag] = ""
                        pb_utils.Logger.log_info(f"trtbuild: request {tag} cancelled by the client")
                    elif cut:
                        cancelled[tag] = "the server is shutting down; the generation was cut"
                    else:
                        continue
                    self.batcher.cancel(tag)
                checked = time.monotonic()
            self._step(active, cancelled)

    def _start(self, item: tuple[Any, Any], active: dict[int, tuple[Any, bool]]) -> None:
        from trtbuild.core.errors import UserError

        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender, prepared = item
        try:
            if draining():
                self.outbox.put((sender, self.unavailable("the server is shutting down"), final))
                return
            if isinstance(prepared, Exception):
                raise prepared
            gen, stream, tokens = prepared
            tag = next(self._tags)
            self.batcher.submit(gen, tag, prepared=tokens)
            active[tag] = (sender, stream)
        except (BadRequest, UserError) as exc:
            self.outbox.put((sender, self.error(str(exc), bad_request=True), final))

    def _step(self, active: dict[int, tuple[Any, bool]], cancelled: dict[int, str]) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            events = self.batcher.step()
        except Exception as exc:  # a failed step fails the batch, not the model
            pb_utils.Logger.log_error(traceback.format_exc())
            for tag in self.batcher.reset():
                sender, _ = active.pop(tag)
                self.outbox.put((sender, self.error(f"generation failed: {exc}", bad_request=False), final))
            cancelled.clear()
            return
        for event in events:
            sender, stream = active[event.tag]
            if event.finished:
                del active[event.tag]
            if event.error is not None:  # this request alone failed; the batch goes on
                cancelled.pop(event.tag, None)
                self.outbox.put((sender, self.error(f"generation failed: {event.error}", bad_request=False), final))
            elif event.tag in cancelled:
                if event.finished:
                    why = cancelled.pop(event.tag)
                    self.outbox.put((sender, self.unavailable(why) if why else None, final))
            elif stream:
                if event.chunk.ids or event.chunk.text:
                    self.outbox.put((sender, self.response(event.chunk.text, event.chunk.ids), 0))
                if event.finished:
                    self.outbox.put((sender, None, final))
            elif event.finished:
                self.outbox.put((sender, self.response(event.result_text or "", event.result_ids or []), final))

    def _send_loop(self) -> None:
        """Sends (sender, response or None, flags) in order. A send waits for the server to take
        the response (~0.85 ms per chunk measured on 2 cores); here that overlaps the next decode step."""
        while True:
            item = self.outbox.get()
            if item is None:
                return
            sender, response, flags = item
            try:
                sender.send(response, flags=flags)
            except Exception:  # a client gone away must not stop the responses of the others
                pb_utils.Logger.log_error(traceback.format_exc())

    def finalize(self) -> None:
        # Triton drains in-flight requests before unloading; the decode thread finishes what it has.
        self.incoming.put(None)  # the tokenizing thread passes it on to the decode thread
        self.preparing.join(timeout=30)
        self.worker.join(timeout=30)
        self.outbox.put(None)  # after the decode thread: its last responses are queued before this
        self.sending.join(timeout=30)
