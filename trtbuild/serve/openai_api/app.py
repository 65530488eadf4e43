"""OpenAI-compatible routes (aiohttp) in front of the Triton deployment.

/v1/models, /v1/completions and /v1/chat/completions (JSON or server-sent events), /health.
Each request becomes one streamed Triton request (`upstream.generate_stream`); this layer only
renders the chat template, applies stop sequences, counts usage and shapes OpenAI bodies.
Every failure is answered as OpenAI does: {"error": {"message", "type", "param", "code"}}; a body
that cannot be read as UTF-8 JSON (an unknown charset, a Content-Encoding aiohttp cannot decode, a
lone surrogate) is a 400. Prompts are limited by the model's context: by bytes before tokenizing,
by tokens after; tokenizing and the chat template run on the default executor, off the event loop.
A client that goes away cancels its handler (aiohttp's handler_cancellation), streaming or not,
and with it the Triton stream, which cancels the generation.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from trtbuild.serve.listener import BodyError, read_body
from trtbuild.serve.openai_api.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, parse
from trtbuild.serve.openai_api.text import PromptText, StopText
from trtbuild.serve.openai_api.upstream import generate_stream


@dataclass(frozen=True)
class FrontConfig:
    model_id: str  # what /v1/models lists and requests name
    triton_url: str  # http://host:port of Triton's HTTP endpoint
    triton_model: str
    prompts: PromptText
    default_max_tokens: int  # when a request sets none (the deployment's default_max_tokens)
    eos_ids: frozenset[int]
    context_tokens: int = 4096  # the target's positions: prompt + completion must fit
    max_prompt_bytes: int = 1 << 20  # longer prompts cannot fit the context (textgen.prompt_byte_limit)
    upstream_headers: tuple[tuple[str, str], ...] = ()  # the key of tritonserver's restricted APIs
    problem: Callable[[], str | None] = lambda: None  # why the model cannot answer now (503), if so
    upstream_url: Callable[[], str] | None = None  # Triton's HTTP endpoint now, when it can move (serve)

    def triton_base(self) -> str:
        """Where requests go now: a restarted tritonserver may listen on other ports."""
        return self.upstream_url() if self.upstream_url is not None else self.triton_url


@dataclass
class Outcome:
    text: str
    completion_tokens: int
    finish_reason: str


CONFIG = web.AppKey("config", FrontConfig)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, ensure_ascii=False))


@web.middleware
async def openai_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
    try:
        return await handler(request)
    except OpenAIError as exc:
        return _json(exc.body(), exc.status)
    except web.HTTPException as exc:  # unknown route, wrong method, body too large
        if exc.status < 400:
            raise
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return _json(OpenAIError(exc.status, f"{exc.reason}: {request.method} {request.path}", type=kind).body(),
                     exc.status)
    except Exception as exc:  # a bug here must still answer in OpenAI's format (and be logged)
        logging.getLogger(__name__).exception("request failed")
        return _json(OpenAIError(500, f"internal error: {exc}", type="server_error").body(), 500)


async def _body(request: web.Request) -> Any:
    charset = request.charset or "utf-8"
    try:
        codecs.lookup(charset)
    except LookupError:
        raise OpenAIError(400, f"unknown charset {charset!r} in Content-Type; send UTF-8") from None
    try:
        raw = await read_body(request)
    except BodyError as exc:  # e.g. Content-Encoding br, or a deflate body that does not inflate
        raise OpenAIError(400, str(exc)) from None
    try:
        body = json.loads(raw.decode(charset))
        json.dumps(body, ensure_ascii=False).encode("utf-8")  # lone surrogates (\ud800) cannot be sent on
    except UnicodeError as exc:
        raise OpenAIError(400, f"the request body is not valid Unicode text: {exc.reason}") from None
    except (ValueError, RecursionError) as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}") from None
    return body


class Generation:
    """One request through Triton: stop sequences, token counts, finish reason."""

    def __init__(self, config: FrontConfig, session: aiohttp.ClientSession, prompt: str, req: Any,
                 budget: int | None, prompt_tokens: int) -> None:
        self.config, self.session = config, session
        self.max_tokens = budget or config.default_max_tokens
        self.fields: dict[str, Any] = {"text_input": prompt, "max_tokens": self.max_tokens,
                                       "temperature": req.temperature, "top_p": req.top_p}
        if req.seed is not None:
            self.fields["seed"] = req.seed
        self.stop = StopText(req.stops)
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.last_id: int | None = None

    @classmethod
    async def start(cls, config: FrontConfig, session: aiohttp.ClientSession, prompt: str, req: Any,
                    budget: int | None) -> Generation:
        """Checks the prompt against the context (bytes first, then tokens counted off the loop)."""
        size = len(prompt.encode("utf-8"))
        if size > config.max_prompt_bytes:
            raise OpenAIError(400, f"the prompt is {size} bytes; this model's context of {config.context_tokens} "
                              f"tokens holds at most {config.max_prompt_bytes}", param="prompt",
                              code="context_length_exceeded")
        count = await asyncio.get_running_loop().run_in_executor(None, config.prompts.count, prompt)
        if count >= config.context_tokens:  # the model checks prompt + max_tokens itself
            raise OpenAIError(400, f"This model's maximum context length is {config.context_tokens} tokens; "
                              f"the prompt alone is {count}.", param="prompt", code="context_length_exceeded")
        return cls(config, session, prompt, req, budget, count)

    async def deltas(self) -> AsyncIterator[str]:
        stream = generate_stream(self.session, self.config.triton_base(), self.config.triton_model, self.fields,
                                 headers=dict(self.config.upstream_headers))
        try:
            async for text, ids in stream:
                self.completion_tokens += len(ids)
                if ids:
                    self.last_id = ids[-1]
                out = self.stop.feed(text)
                if out:
                    yield out
                if self.stop.stopped:
                    return  # closing the stream cancels the rest in Triton
            rest = self.stop.flush()
            if rest:
                yield rest
        finally:
            await stream.aclose()

    @property
    def finish_reason(self) -> str:
        if self.stop.stopped or self.last_id in self.config.eos_ids:
            return "stop"
        return "length" if self.completion_tokens >= self.max_tokens else "stop"

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    async def run(self) -> Outcome:
        text = "".join([delta async for delta in self.deltas()])
        return Outcome(text, self.completion_tokens, self.finish_reason)


def _check_model(config: FrontConfig, name: str) -> None:
    if name != config.model_id:
        raise OpenAIError(404, f"The model `{name}` does not exist (this server serves `{config.model_id}`).",
                          param="model", code="model_not_found")


async def _sse(request: web.Request, events: AsyncIterator[dict[str, Any]]) -> web.StreamResponse:
    """Server-sent events; the first event is pulled before the headers go out, so a request
    Triton refuses still gets a proper 4xx instead of a 200 stream."""
    first = await events.__anext__()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def send(data: dict[str, Any]) -> None:
        await response.write(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")

    try:
        await send(first)
        async for event in events:
            await send(event)
    except OpenAIError as exc:  # after the headers: the error travels as an event
        await send(exc.body())
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        await events.aclose()  # the client left: close Triton's stream, which cancels the request
        return response
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def models(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    return _json({"object": "list", "data": [{"id": config.model_id, "object": "model",
                                              "created": int(time.time()), "owned_by": "trtbuild"}]})


def _check_up(config: FrontConfig) -> None:
    problem = config.problem()
    if problem is not None:
        raise OpenAIError(503, problem, type="server_error")


async def health(request: web.Request) -> web.Response:
    _check_up(request.app[CONFIG])
    return web.Response(status=200)


async def completions(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG]
    _check_up(config)
    req = parse(CompletionRequest, await _body(request))
    _check_model(config, req.model)
    gen = await Generation.start(config, request.app[SESSION], req.prompt, req, req.max_tokens)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": config.model_id}
    if not req.stream:
        out = await gen.run()
        return _json({**head, "choices": [{"index": 0, "text": out.text, "logprobs": None,
                                            "finish_reason": out.finish_reason}], "usage": gen.usage()})

    async def events() -> AsyncIterator[dict[str, Any]]:
        async for delta in gen.deltas():
            yield {**head, "choices": [{"index": 0, "text": delta, "logprobs": None, "finish_reason": None}]}
        yield {**head, "choices": [{"index": 0, "text": "", "logprobs": None,
                                    "finish_reason": gen.finish_reason}]}
        if req.include_usage:
            yield {**head, "choices": [], "usage": gen.usage()}

    return await _sse(request, events())


async def chat_completions(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG]
    _check_up(config)
    req = parse(ChatCompletionRequest, await _body(request))
    _check_model(config, req.model)
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    if sum(len(m["content"]) for m in messages) > config.max_prompt_bytes:  # before rendering the template
        raise OpenAIError(400, f"the messages are over {config.max_prompt_bytes} characters; this model's context "
                          f"of {config.context_tokens} tokens holds fewer", param="messages",
                          code="context_length_exceeded")
    prompt = await asyncio.get_running_loop().run_in_executor(None, config.prompts.chat, messages)
    gen = await Generation.start(config, request.app[SESSION], prompt, req, req.token_budget)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": config.model_id}
    if not req.stream:
        out = await gen.run()
        return _json({**head, "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                                            "logprobs": None, "finish_reason": out.finish_reason}],
                      "usage": gen.usage()})
    head["object"] = "chat.completion.chunk"

    async def events() -> AsyncIterator[dict[str, Any]]:
        first = True
        async for delta in gen.deltas():
            message = {"role": "assistant", "content": delta} if first else {"content": delta}
            first = False
            yield {**head, "choices": [{"index": 0, "delta": message, "logprobs": None, "finish_reason": None}]}
        yield {**head, "choices": [{"index": 0, "delta": {} if not first else {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": gen.finish_reason}]}
        if req.include_usage:
            yield {**head, "choices": [], "usage": gen.usage()}

    return await _sse(request, events())


def create_app(config: FrontConfig, *middlewares: Any) -> web.Application:
    # aiohttp's 1 MiB body limit stays; `middlewares` come first (the listener's busy marks)
    app = web.Application(middlewares=[*middlewares, openai_errors])
    app[CONFIG] = config

    async def session_context(app: web.Application) -> AsyncIterator[None]:
        # no connection cap (the listener caps the clients, each holds one Triton stream);
        # force_close: no idle connection is left for tritonserver to wait on when it stops
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            app[SESSION] = session
            yield

    app.cleanup_ctx.append(session_context)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    return app
