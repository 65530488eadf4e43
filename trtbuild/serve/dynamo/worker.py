"""A Dynamo worker process serving the project's runtime: `python -m trtbuild.serve.dynamo.worker MODEL_DIR ...`.

MODEL_DIR is the local repository's model directory (repo_local/<model_name>): its config.pbtxt names the
bundle's target, draft and tokenizer and the in-flight batching settings, read by the same code as the Triton
python-backend model (trtbuild.serve.textgen.generator_for_model, trtbuild.serve.textbatch.TextBatcher).

The worker registers with `register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, ...)`:
Dynamo's frontend applies the chat template, tokenizes, and sends `token_ids` with `stop_conditions` and
`sampling_options`; the worker streams `{"token_ids": [...]}` back, the last with a `finish_reason`. One decode
thread batches every request in flight (a new one joins at the next step, a cancelled one leaves).
SIGTERM: the endpoint stops taking requests, those in flight finish (Dynamo's graceful shutdown), then it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import queue
import signal
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from trtbuild.core.data.chat import FALLBACK_CHAT_TEMPLATE
from trtbuild.core.pbtxt import parameters_of, parse_config
from trtbuild.runtime import SamplingParams
from trtbuild.serve.textbatch import TextBatcher
from trtbuild.serve.textgen import GenRequest, generator_from_params

FALLBACK_TEMPLATE_FILE = "chat_template.jinja"


class Engine:
    """The in-flight batch on a thread of its own; asyncio requests in, token chunks out."""

    def __init__(self, model_dir: Path) -> None:
        config = parse_config(model_dir / "config.pbtxt")
        params = parameters_of(config)
        self.generator = generator_from_params(params, model_dir)
        self.default_max_tokens = int(params["default_max_tokens"])
        self.max_tokens_limit = int(params["max_tokens_limit"])
        speculate_up_to = int(params["speculative_max_batch"]) if params.get("speculative_max_batch") else None
        schedule = {int(k): int(v) for k, v in json.loads(params.get("draft_len_schedule") or "{}").items()}
        self.batcher = TextBatcher(self.generator, max(1, int(config.max_batch_size)), speculate_up_to,
                                   schedule or None)
        self.eos = set(self._eos_ids())
        self._tags = itertools.count()
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="trtbuild-decode", daemon=True)
        self.thread.start()

    def _eos_ids(self) -> list[int]:
        eos = self.generator.tokenizer.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos or [])

    def _loop(self) -> None:
        live: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        while True:
            block = self.batcher.idle
            while True:
                try:
                    item = self.inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                kind, tag, payload = item
                if kind == "add":
                    gen, prepared, loop, out = payload
                    try:
                        self.batcher.submit(gen, tag, prepared=prepared)
                        live[tag] = (loop, out)
                    except Exception as exc:  # a bad request is that request's error
                        loop.call_soon_threadsafe(out.put_nowait, ("error", str(exc)))
                elif kind == "cancel":
                    self.batcher.cancel(tag)
            if self.batcher.idle:
                continue
            try:
                events = self.batcher.step()
            except Exception as exc:  # a failed step fails the batch, not the worker
                for tag in self.batcher.reset():
                    loop, out = live.pop(tag)
                    loop.call_soon_threadsafe(out.put_nowait, ("error", f"generation failed: {exc}"))
                continue
            for event in events:
                if event.tag not in live:
                    continue
                loop, out = live[event.tag]
                if event.finished:
                    del live[event.tag]
                if event.error is not None:
                    loop.call_soon_threadsafe(out.put_nowait, ("error", event.error))
                else:
                    loop.call_soon_threadsafe(out.put_nowait, ("tokens", list(event.chunk.ids), event.finished))

    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[dict[str, Any]]:
        ids = [int(t) for t in request.get("token_ids") or []]
        stop = request.get("stop_conditions") or {}
        sampling = request.get("sampling_options") or {}
        max_tokens = min(int(stop.get("max_tokens") or self.default_max_tokens), self.max_tokens_limit)
        if not ids:
            yield {"token_ids": [], "finish_reason": "error"}
            return
        gen = GenRequest(prompt="", max_tokens=max_tokens, temperature=float(sampling.get("temperature") or 0.0),
                         top_k=int(sampling.get("top_k") or 0), top_p=float(sampling.get("top_p") or 1.0),
                         seed=sampling.get("seed"))
        prepared = (ids, SamplingParams(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p, seed=gen.seed),
                    self.generator.spec)
        tag = next(self._tags)
        out: asyncio.Queue[Any] = asyncio.Queue()
        self.inbox.put(("add", tag, (gen, prepared, asyncio.get_running_loop(), out)))
        produced = 0
        try:
            while True:
                item = await out.get()
                if item[0] == "error":
                    yield {"token_ids": [], "finish_reason": "error"}
                    return
                _, tokens, finished = item
                produced += len(tokens)
                if not finished:
                    if tokens:
                        yield {"token_ids": tokens}
                    if context is not None and (context.is_stopped() or context.is_killed()):
                        self.inbox.put(("cancel", tag, None))
                    continue
                reason = "length" if produced >= max_tokens and not (tokens and tokens[-1] in self.eos) else "stop"
                yield {"token_ids": tokens, "finish_reason": reason}
                return
        finally:
            self.inbox.put(("cancel", tag, None))  # a no-op once finished; frees the slot of a client gone away


async def serve(args: argparse.Namespace) -> None:
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    model_dir = Path(args.model_dir).resolve()
    engine = Engine(model_dir)
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    endpoint = runtime.endpoint(args.endpoint)
    tokenizer_dir = str(engine.generator.tokenizer.name_or_path)
    template = Path(args.chat_template) if args.chat_template else None
    if template is None and not getattr(engine.generator.tokenizer, "chat_template", None):
        # The project's OpenAI front renders such a tokenizer's chats with its documented fallback; Dynamo's
        # frontend refuses a model without a template, so it gets the same one (a file under --state-dir).

        template = Path(args.state_dir) / FALLBACK_TEMPLATE_FILE
        template.write_text(FALLBACK_CHAT_TEMPLATE)
    await register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, tokenizer_dir,
                         args.model_name, worker_type=WorkerType.Aggregated,
                         custom_template_path=str(template) if template else None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.shutdown)
    # The instance id ends the names of this worker's discovery entries: `serve` removes them if it dies.
    instance = f"{endpoint.connection_id():x}"
    (Path(args.state_dir) / f"instance-{os.getpid()}").write_text(instance)
    print(f"trtbuild dynamo worker ready (pid {os.getpid()}, instance {instance}, speculative: "
          f"{engine.generator.speculative}, in-flight batch: {engine.batcher.max_batch})", flush=True)
    await endpoint.serve_endpoint(engine.generate, graceful_shutdown=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--endpoint", required=True, help="namespace.component.endpoint")
    parser.add_argument("--chat-template", default=None, help="a Jinja chat template for tokenizers without one")
    parser.add_argument("--state-dir", default=".", help="where the worker may write files (the fallback template)")
    args = parser.parse_args(argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
