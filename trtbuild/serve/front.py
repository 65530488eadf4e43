"""The validating HTTP front before tritonserver's HTTP endpoint (what `trtbuild serve` exposes).

HTTP itself is aiohttp's, on both sides (trtbuild.serve.listener: its server settings, the
connection caps); what is ours are the checks tritonserver lacks. tritonserver 2.51 has no request
size limit and parses request JSON recursively (a 100 KB body of nested brackets kills it), and its
own port answers only requests that carry a secret header which the fronts add (--http-restricted-api,
see trtbuild.serve.server). The front:
- refuses a body over `max_body` bytes (413) and JSON nested more than `max_depth` deep (400);
- serves only the inference, health and metadata routes; shared memory, the model repository,
  logging and trace are refused (403);
- refuses requests a web page can send without CORS (an Origin header, text/plain or form bodies);
- answers /generate fields of the wrong JSON type with 400 and the field (tritonserver says 500);
- sends a non-streaming /generate (and a /generate_stream without `"stream": true`) to a decoupled
  model upstream as a stream of steps and assembles the answer here: tritonserver notices a client
  that went away only when it writes to it, so a stream lets an abandoned request be cancelled. A
  client that leaves cancels its handler (aiohttp's handler_cancellation), which closes the upstream
  connection, which cancels the request;
- answers 503 while tritonserver restarts or drains.
Responses are relayed as they come (streams stay streams; an HTTP/1.0 client gets the body
close-delimited, as aiohttp writes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from trtbuild.serve.field_ranges import field_problem
from trtbuild.serve.listener import BodyError, Limits, Listener, handler_settings, read_body

UPSTREAM_READ_TIMEOUT_S = 600.0
_ALLOWED_GET = ("/v2", "/v2/health/live", "/v2/health/ready")
_MODEL_GET = ("", "/ready", "/config", "/stats")
_MODEL_POST = ("/infer", "/generate", "/generate_stream")
_BROWSER_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones aiohttp sets itself: never relayed.
_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
                  "host", "content-length", "proxy-authorization", "proxy-authenticate"))


_UTF8 = ("utf-8", "utf8", "us-ascii", "ascii")  # charsets whose JSON tritonserver reads as it is meant


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_depth(data: bytes, limit: int) -> int:
    """Nesting depth of a JSON text, counted outside strings, without parsing it (stops past `limit`)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _refusals(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refused as refused:
        return _error(refused.status, str(refused))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.text or exc.reason)


class Front:
    """Runs its own asyncio loop in a thread; `start()` binds the public port (errors surface there).

    `upstream_headers` go with every request to tritonserver (the secret of its restricted APIs)."""

    def __init__(self, host: str, port: int, upstream_port: int, *, max_body: int, max_depth: int,
                 upstream_headers: dict[str, str] | None = None, limits: Limits | None = None) -> None:
        self.host, self.port, self.upstream_port = host, port, upstream_port
        self.max_body, self.max_depth = max_body, max_depth
        self.upstream_headers = dict(upstream_headers or {})
        self.accepting = True  # False while draining: new requests get 503
        self.upstream_up = True  # False while tritonserver restarts
        self.problem: Callable[[], str | None] = lambda: None  # a reason to answer 503 (a stopped model)
        self.listener = Listener(limits or Limits.from_fd_limit())
        self._models: dict[str, dict[str, Any]] = {}
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._thread: threading.Thread | None = None

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.upstream_port}"

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.port = self.listener.bind(self.host, self.port)
        self._loop.run_until_complete(self._setup())
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtbuild-front", daemon=True)
        self._thread.start()

    async def _setup(self) -> None:
        app = web.Application(middlewares=[self.listener.middleware, _refusals], client_max_size=self.max_body)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=5, **handler_settings())
        await self._runner.setup()
        # force_close: no idle upstream connection is ever left for tritonserver to wait on at its stop
        connector = aiohttp.TCPConnector(force_close=True, limit=self.listener.limits.total)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=UPSTREAM_READ_TIMEOUT_S)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                              skip_auto_headers=("User-Agent", "Accept-Encoding"))
        self.listener.start(self._runner.server)

    def close(self) -> None:
        if self._thread is None:
            return

        async def shutdown() -> None:
            await self.listener.close()
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None
        self._loop.close()

    # -- one request -------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._check_head(request)
        body = b""
        if request.method == "POST":
            if request.content_length is not None and request.content_length > self.max_body:
                raise Refused(413, f"the body is {request.content_length} bytes; this server takes at most "
                              f"{self.max_body}")
            try:
                body = await read_body(request)
            except web.HTTPRequestEntityTooLarge:
                raise Refused(413, f"the body is over {self.max_body} bytes; this server takes at most "
                              f"{self.max_body}") from None
            except BodyError as exc:
                raise Refused(400, str(exc)) from None
            self._check_body(request, body)
        route = _model_route(request.path)
        if request.method == "POST" and route and route[1] in ("/generate", "/generate_stream"):
            fields = await self._generate_fields(body, route[0])
            one_answer = route[1] == "/generate" or not _wants_steps(fields)
            if one_answer and (await self._model(route[0])).get("decoupled"):
                return await self._generate_as_stream(route[0], fields, request, as_event=route[1] != "/generate")
        return await self._relay(request, body)

    def _check_head(self, request: web.Request) -> None:
        if not self.accepting:
            raise Refused(503, "the server is shutting down")
        if not self.upstream_up:
            raise Refused(503, "the server is restarting; try again shortly")
        if request.path != "/v2/health/live":
            problem = self.problem()
            if problem is not None:
                raise Refused(503, problem)
        if "Origin" in request.headers:
            raise Refused(403, "requests from web pages (an Origin header) are not served")
        path, method = request.path, request.method
        model_route = _model_route(path)
        if method in ("GET", "HEAD"):
            if path not in _ALLOWED_GET and not (model_route and model_route[1] in _MODEL_GET):
                raise Refused(403 if _restricted(path) else 404, f"{path} is not served here")
            return
        if method != "POST":
            raise Refused(405, f"{method} is not served")
        if not model_route or model_route[1] not in _MODEL_POST:
            raise Refused(403 if _restricted(path) else 404, f"POST {path} is not served here")
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type in _BROWSER_TYPES:
            raise Refused(415, f"Content-Type {content_type} is not accepted; send application/json")
        charset = request.charset  # tritonserver reads every body as UTF-8, whatever the header says
        if charset is not None and charset.strip().lower() not in _UTF8:
            raise Refused(415, f"charset {charset!r} in Content-Type is not read here; send UTF-8")

    def _check_body(self, request: web.Request, body: bytes) -> None:
        json_part = body
        header_length = request.headers.get("Inference-Header-Content-Length")
        if header_length is not None:  # binary tensor extension: JSON header, then raw bytes
            try:
                json_part = body[: int(header_length)]
            except ValueError:
                raise Refused(400, "Inference-Header-Content-Length is not a number") from None
        if json_depth(json_part, self.max_depth) > self.max_depth:
            raise Refused(400, f"the JSON is nested more than {self.max_depth} levels deep")

    # -- upstream ----------------------------------------------------------------------------
    def _forward_headers(self, request: web.Request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in _HOP and k.lower() not in {h.lower() for h in self.upstream_headers}}
        return {**headers, **self.upstream_headers}

    async def _relay(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Copy one upstream response to the client as it arrives."""
        assert self._session is not None
        try:
            async with self._session.request(request.method, self.upstream + request.rel_url.raw_path_qs,
                                             data=body if request.method == "POST" else None,
                                             headers=self._forward_headers(request),
                                             allow_redirects=False) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP:
                        response.headers.add(name, value)
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
                async for piece in upstream.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
                return response
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError):
            raise Refused(502, "tritonserver closed the connection (it may have stopped)") from None

    async def _model(self, name: str) -> dict[str, Any]:
        """Input datatypes and the transaction policy of a model (read once from tritonserver)."""
        assert self._session is not None
        if name not in self._models:
            try:
                async with self._session.get(f"{self.upstream}/v2/models/{name}/config",
                                             headers=self.upstream_headers,
                                             timeout=aiohttp.ClientTimeout(total=5)) as response:
                    if response.status != 200:
                        return {}  # unknown model: tritonserver answers it
                    config = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return {}
            self._models[name] = {
                "inputs": {i["name"]: i.get("data_type", "") for i in config.get("input", [])},
                "decoupled": bool(config.get("model_transaction_policy", {}).get("decoupled"))}
        return self._models[name]

    async def _generate_fields(self, body: bytes, model: str) -> dict[str, Any]:
        """Check the /generate body's field types against the model's inputs (raises Refused)."""
        try:
            fields = json.loads(body or b"null")
        except (ValueError, RecursionError):
            raise Refused(400, "the body is not valid JSON") from None
        if not isinstance(fields, dict):
            raise Refused(400, "the body must be a JSON object of the model's inputs")
        try:  # an escaped lone surrogate ("\ud800") parses, but is no Unicode text the model can take
            json.dumps(fields, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Refused(400, f"the body holds {exc.object[exc.start:exc.end]!a}, a lone surrogate, "
                          "which is not Unicode text") from None
        inputs = (await self._model(model)).get("inputs", {})
        for name, datatype in inputs.items():
            problem = field_problem(name, fields[name], datatype) if name in fields else None
            if problem:  # checked before tritonserver casts it (2^32 + 8 would become 8 in an INT32)
                raise Refused(400, problem)
        return fields

    async def _generate_as_stream(self, model: str, fields: dict[str, Any], request: web.Request,
                                  as_event: bool = False) -> web.Response:
        """The steps of one generation assembled into /generate's answer, or with `as_event` into
        the one event tritonserver's /generate_stream sends without `stream` (a refusal or an error
        in the stream, a cut at shutdown included, is then an error event of a 200, as tritonserver's)."""
        assert self._session is not None
        prompts = fields.get("text_input")  # one stream flag per prompt: the model's own checks then apply
        stream: Any = [True] * len(prompts) if isinstance(prompts, list) and prompts else True
        # identity: the events are parsed here (a client's Accept-Encoding applies to our answer, not this)
        headers = {k: v for k, v in self._forward_headers(request).items()
                   if k.lower() not in ("content-type", "accept-encoding")}
        headers.update({"Content-Type": "application/json", "Accept-Encoding": "identity"})
        try:
            async with self._session.post(f"{self.upstream}/v2/models/{model}/generate_stream",
                                          data=json.dumps({**fields, "stream": stream}).encode(),
                                          headers=headers) as upstream:
                status, raw = upstream.status, await upstream.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError):
            raise Refused(502, "tritonserver closed the connection (it may have stopped)") from None
        if status != 200:  # refused before any response: tritonserver kept the model's code (400, 503, ...)
            error = _first_error(raw)
            if error is not None:  # (its /generate_stream without `stream` sends the refusal as an event)
                return _event({"error": error}) if as_event else _error(status, error)
            return web.Response(status=status, body=raw, content_type="application/json")
        merged: dict[str, Any] = {}
        ids: list[Any] = []
        for event in raw.decode("utf-8", "replace").split("\n\n"):
            data = event.strip()
            if not data.startswith("data:"):
                continue
            piece = json.loads(data[5:])
            if "error" in piece:
                message = str(piece["error"])
                if as_event:
                    return _event({"error": message})
                return _error(503 if "shutting down" in message else (400 if not merged else 500), message)
            merged.setdefault("output_ids", [])
            for key, value in piece.items():
                if key == "output_ids":  # tritonserver writes a one-element tensor as a bare number
                    ids.extend(value if isinstance(value, list) else [value])
                elif key == "text_output" and key in merged:
                    merged[key] += value
                else:
                    merged[key] = value
        if "output_ids" in merged or ids:
            merged["output_ids"] = ids[0] if len(ids) == 1 else ids
        merged = dict(sorted(merged.items()))  # tritonserver's order: model_name, model_version, outputs
        if as_event:
            return _event(merged)
        return web.Response(body=json.dumps(merged, separators=(",", ":"), ensure_ascii=False).encode(),
                            content_type="application/json")


def _wants_steps(fields: dict[str, Any]) -> bool:
    """A /generate_stream that asks for one response per step (`"stream": true`, for any prompt)."""
    flag = fields.get("stream")
    return any(v is True for v in flag) if isinstance(flag, list) else flag is True


def _event(data: dict[str, Any]) -> web.Response:
    """One server-sent event holding `data`, as tritonserver's /generate_stream writes it."""
    body = b"data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    return web.Response(body=body, content_type="text/event-stream", charset="utf-8")


def _first_error(raw: bytes) -> str | None:
    """The error message of an event-stream or JSON body (`data: {"error": ...}`), else None."""
    for event in raw.decode("utf-8", "replace").split("\n\n"):
        data = event.strip().removeprefix("data:")
        with contextlib.suppress(ValueError):
            piece = json.loads(data)
            if isinstance(piece, dict) and "error" in piece:
                return str(piece["error"])
    return None


def _model_route(path: str) -> tuple[str, str] | None:
    """('llm', '/generate') for /v2/models/llm[/versions/1]/generate."""
    if not path.startswith("/v2/models/"):
        return None
    rest = path[len("/v2/models/"):].split("/")
    name, tail = rest[0], rest[1:]
    if not name:
        return None
    if len(tail) >= 2 and tail[0] == "versions":
        tail = tail[2:]
    if len(tail) > 1:
        return (name, "/" + "/".join(tail))  # e.g. trace/setting: not served
    return (name, "/" + tail[0] if tail else "")


def _restricted(path: str) -> bool:
    return any(word in path for word in ("sharedmemory", "repository", "logging", "trace"))


