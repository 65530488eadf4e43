"""A small validating HTTP front in front of tritonserver's HTTP endpoint (what `trtbuild serve` exposes).

tritonserver 2.51 has no request size limit (no --http-max-input-size) and parses request JSON
recursively: a 100 KB body of nested brackets kills it. The front listens on the public port, checks
each request, and forwards only what passes to tritonserver's own port (127.0.0.1, a free port):
- a request head of at most MAX_HEAD bytes, a body of at most `max_body` bytes with a Content-Length
  (413 / 411 otherwise), JSON nested at most `max_depth` deep (400);
- only the inference, health and metadata routes; shared memory, the model repository, logging and
  trace are refused (403) here, and tritonserver restricts them too (--http-restricted-api);
- requests a web page can send without CORS (an Origin header, text/plain or form bodies) are refused;
- /generate fields of the wrong JSON type are answered 400 with the field (tritonserver says 500);
- a non-streaming /generate to a decoupled model goes upstream as /generate_stream and is assembled
  here: tritonserver notices a client that went away only when it writes to it, so a stream lets an
  abandoned request be cancelled (the model checks) instead of running to its end;
- while tritonserver restarts or drains, requests are answered 503.
Bytes of responses are relayed as they come (streams stay streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MAX_HEAD = 64 * 1024
IO_TIMEOUT_S = 120.0
_ALLOWED_GET = ("/v2", "/v2/health/live", "/v2/health/ready")
_MODEL_GET = ("", "/ready", "/config", "/stats")
_MODEL_POST = ("/infer", "/generate", "/generate_stream")
_BROWSER_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
_JSON_TYPES = {"TYPE_STRING": (str,), "TYPE_BOOL": (bool,), "TYPE_FP32": (int, float), "TYPE_FP16": (int, float),
               "TYPE_FP64": (int, float), "TYPE_BF16": (int, float)}
_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
            431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable"}


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


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    lower: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


def _response(status: int, message: str, *, close: bool = False) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode() + body


class Front:
    """Runs its own asyncio loop in a thread; `start()` binds the public port (errors surface there)."""

    def __init__(self, host: str, port: int, upstream_port: int, *, max_body: int, max_depth: int) -> None:
        self.host, self.port, self.upstream_port = host, port, upstream_port
        self.max_body, self.max_depth = max_body, max_depth
        self.accepting = True  # False while draining: new requests get 503
        self.upstream_up = True  # False while tritonserver restarts
        self._models: dict[str, dict[str, Any]] = {}
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, sock=sock, limit=MAX_HEAD))
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtbuild-front", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # their `finally` runs in this loop

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None
        self._loop.close()

    # -- one client connection ----------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    request = await asyncio.wait_for(self._read_request(reader), IO_TIMEOUT_S)
                except Refused as refused:
                    writer.write(_response(refused.status, str(refused), close=True))
                    await writer.drain()
                    return
                if request is None:
                    return
                try:
                    self._check(request)
                except Refused as refused:
                    writer.write(_response(refused.status, str(refused)))
                    await writer.drain()
                    continue
                if upstream is None or upstream[0].at_eof():
                    upstream = await self._connect()
                    if upstream is None:
                        writer.write(_response(503, "the server is restarting; try again shortly"))
                        await writer.drain()
                        continue
                try:
                    keep = await self._forward(request, upstream, reader, writer)
                except Refused as refused:
                    writer.write(_response(refused.status, str(refused)))
                    await writer.drain()
                    continue
                if not keep:
                    return
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            for stream_writer in (writer, upstream[1] if upstream else None):
                if stream_writer is not None:
                    stream_writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None  # the client closed between requests
        except asyncio.LimitOverrunError:
            raise Refused(431, f"the request head exceeds {MAX_HEAD} bytes") from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise Refused(400, "malformed request line")
        headers = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise Refused(400, "malformed header line")
            headers.append((name, value.strip()))
        request = Request(parts[0], parts[1], parts[2], headers)
        request.lower = {k.lower(): v for k, v in headers}
        if "transfer-encoding" in request.lower:
            raise Refused(411, "send the body with a Content-Length (chunked request bodies are not accepted)")
        try:
            length = int(request.lower.get("content-length", "0"))
        except ValueError:
            raise Refused(400, "Content-Length is not a number") from None
        if length < 0:
            raise Refused(400, "Content-Length is negative")
        if length > self.max_body:
            raise Refused(413, f"the body is {length} bytes; this server takes at most {self.max_body}")
        request.body = await reader.readexactly(length) if length else b""
        return request

    def _check(self, request: Request) -> None:
        if not self.accepting:
            raise Refused(503, "the server is shutting down")
        if not self.upstream_up:
            raise Refused(503, "the server is restarting; try again shortly")
        if "origin" in request.lower:
            raise Refused(403, "requests from web pages (an Origin header) are not served")
        path, method = request.path, request.method
        model_route = _model_route(path)
        if method == "GET":
            if path not in _ALLOWED_GET and not (model_route and model_route[1] in _MODEL_GET):
                raise Refused(403 if _restricted(path) else 404, f"{path} is not served here")
            return
        if method != "POST":
            raise Refused(405, f"{method} is not served")
        if not model_route or model_route[1] not in _MODEL_POST:
            raise Refused(403 if _restricted(path) else 404, f"POST {path} is not served here")
        content_type = request.lower.get("content-type", "").split(";")[0].strip().lower()
        if content_type in _BROWSER_TYPES:
            raise Refused(415, f"Content-Type {content_type} is not accepted; send application/json")
        json_part = request.body
        header_length = request.lower.get("inference-header-content-length")
        if header_length is not None:  # binary tensor extension: JSON header, then raw bytes
            try:
                json_part = request.body[: int(header_length)]
            except ValueError:
                raise Refused(400, "Inference-Header-Content-Length is not a number") from None
        if json_depth(json_part, self.max_depth) > self.max_depth:
            raise Refused(400, f"the JSON is nested more than {self.max_depth} levels deep")

    # -- forwarding ----------------------------------------------------------------------------
    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.upstream_port, limit=MAX_HEAD),
                                          5.0)
        except (TimeoutError, OSError):
            return None

    async def _forward(self, request: Request, upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                       client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> bool:
        """Relay one request; False when the connection must close afterwards."""
        route = _model_route(request.path)
        if request.method == "POST" and route and route[1] in ("/generate", "/generate_stream"):
            fields = await self._generate_fields(request, route[0])
            if route[1] == "/generate" and fields is not None and (await self._model(route[0])).get("decoupled"):
                return await self._generate_as_stream(request, route[0], fields, upstream, client_reader, client)
        up_reader, up_writer = upstream
        up_writer.write(_head(request.method, request.target, request.headers, len(request.body)) + request.body)
        await up_writer.drain()
        watcher = asyncio.ensure_future(_client_gone(client_reader))
        try:
            return await _relay_response(up_reader, client, watcher)
        finally:
            watcher.cancel()

    async def _model(self, name: str) -> dict[str, Any]:
        """Input datatypes and the transaction policy of a model (read once from tritonserver)."""
        if name not in self._models:
            url = f"http://127.0.0.1:{self.upstream_port}/v2/models/{name}/config"

            def fetch() -> dict[str, Any]:
                with urllib.request.urlopen(url, timeout=5) as response:
                    return json.loads(response.read())

            try:
                config = await asyncio.get_running_loop().run_in_executor(None, fetch)
            except Exception:
                return {}  # unknown model: tritonserver answers it
            self._models[name] = {
                "inputs": {i["name"]: i.get("data_type", "") for i in config.get("input", [])},
                "decoupled": bool(config.get("model_transaction_policy", {}).get("decoupled"))}
        return self._models[name]

    async def _generate_fields(self, request: Request, model: str) -> dict[str, Any] | None:
        """Check the /generate body's field types against the model's inputs (raises Refused)."""
        try:
            body = json.loads(request.body or b"null")
        except (ValueError, RecursionError):
            raise Refused(400, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise Refused(400, "the body must be a JSON object of the model's inputs")
        inputs = (await self._model(model)).get("inputs", {})
        for name, datatype in inputs.items():
            if name in body and not _type_ok(body[name], datatype):
                raise Refused(400, f"{name} must be {_type_word(datatype)}, got {json.dumps(body[name])[:40]}")
        return body

    async def _generate_as_stream(self, request: Request, model: str, fields: dict[str, Any],
                                  upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                                  client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> bool:
        up_reader, up_writer = upstream
        prompts = fields.get("text_input")  # one stream flag per prompt: the model's own checks then apply
        stream: Any = [True] * len(prompts) if isinstance(prompts, list) and prompts else True
        body = json.dumps({**fields, "stream": stream}).encode()
        headers = [(k, v) for k, v in request.headers if k.lower() not in ("content-length", "content-type")]
        headers.append(("Content-Type", "application/json"))
        up_writer.write(_head("POST", f"/v2/models/{model}/generate_stream", headers, len(body)) + body)
        await up_writer.drain()
        watcher = asyncio.ensure_future(_client_gone(client_reader))
        try:
            status, _, raw = await _read_response(up_reader, watcher)
        finally:
            watcher.cancel()
        if status is None:
            return False  # the client went away: dropping the upstream connection cancels the request
        if status != 200:  # refused before any response: tritonserver kept the model's code (400, 503, ...)
            error = _first_error(raw)
            client.write(_response(status, error) if error is not None else _plain(status, raw))
            await client.drain()
            return True
        merged: dict[str, Any] = {}
        ids: list[Any] = []
        for event in raw.decode("utf-8", "replace").split("\n\n"):
            data = event.strip()
            if not data.startswith("data:"):
                continue
            piece = json.loads(data[5:])
            if "error" in piece:
                message = str(piece["error"])
                code = 503 if "shutting down" in message else (400 if not merged else 500)
                client.write(_response(code, message))
                await client.drain()
                return True
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
        client.write(_plain(200, json.dumps(merged, separators=(",", ":"), ensure_ascii=False).encode()))
        await client.drain()
        return True


def _first_error(raw: bytes) -> str | None:
    """The error message of an event-stream body (`data: {"error": ...}`), else None."""
    for event in raw.decode("utf-8", "replace").split("\n\n"):
        data = event.strip()
        if data.startswith("data:"):
            with contextlib.suppress(ValueError):
                piece = json.loads(data[5:])
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


def _type_ok(value: Any, datatype: str) -> bool:
    values = value if isinstance(value, list) else [value]
    if datatype in _JSON_TYPES:
        allowed = _JSON_TYPES[datatype]
        return all(isinstance(v, allowed) and (bool in allowed or not isinstance(v, bool)) for v in values)
    if datatype.startswith("TYPE_INT") or datatype.startswith("TYPE_UINT"):
        unsigned = datatype.startswith("TYPE_UINT")
        return all(isinstance(v, int) and not isinstance(v, bool) and (v >= 0 or not unsigned) for v in values)
    return True


def _type_word(datatype: str) -> str:
    if datatype == "TYPE_STRING":
        return "a string"
    if datatype == "TYPE_BOOL":
        return "true or false"
    if datatype.startswith("TYPE_UINT"):
        return "a whole number >= 0"
    return "a whole number" if datatype.startswith("TYPE_INT") else "a number"


def _head(method: str, target: str, headers: list[tuple[str, str]], length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in ("content-length", "connection", "keep-alive")]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _plain(status: int, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'OK' if status == 200 else 'Error')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def _client_gone(reader: asyncio.StreamReader) -> None:
    """Returns once the client has closed its side (polled: its unread bytes are left alone)."""
    while not reader.at_eof():
        await asyncio.sleep(0.05)


async def _read_head(up_reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]], bytes]:
    head = await up_reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
    return status, headers, head


async def _race(awaitable: Any, watcher: asyncio.Future[None]) -> Any:
    """The awaitable's result, or raises ConnectionError when the client goes away first."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    raise ConnectionError("the client went away")


async def _read_response(up_reader: asyncio.StreamReader, watcher: asyncio.Future[None]
                         ) -> tuple[int | None, list[tuple[str, str]], bytes]:
    """A whole upstream response (status, headers, de-chunked body); status None if the client left."""
    try:
        status, headers, _ = await _race(_read_head(up_reader), watcher)
        body = bytearray()
        async for piece in _body_pieces(up_reader, headers, watcher):
            body += piece
    except ConnectionError:
        return None, [], b""
    return status, headers, bytes(body)


async def _body_pieces(up_reader: asyncio.StreamReader, headers: list[tuple[str, str]],
                       watcher: asyncio.Future[None]) -> Any:
    lower = {k.lower(): v for k, v in headers}
    if lower.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await _race(up_reader.readuntil(b"\r\n"), watcher)
            size = int(size_line.split(b";")[0].strip(), 16)
            data = await _race(up_reader.readexactly(size + 2), watcher)
            if size == 0:
                return
            yield data[:-2]
    else:
        remaining = int(lower.get("content-length", "0"))
        while remaining > 0:
            data = await _race(up_reader.read(min(remaining, 1 << 16)), watcher)
            if not data:
                raise ConnectionError("tritonserver closed the connection")
            remaining -= len(data)
            yield data


async def _relay_response(up_reader: asyncio.StreamReader, client: asyncio.StreamWriter,
                          watcher: asyncio.Future[None]) -> bool:
    """Copy one upstream response to the client as it arrives (chunked stays chunked)."""
    try:
        status, headers, head = await _race(_read_head(up_reader), watcher)
    except (asyncio.IncompleteReadError, ConnectionError):
        client.write(_response(502, "tritonserver closed the connection (it may have stopped)", close=True))
        await client.drain()
        return False
    client.write(head)
    chunked = any(k.lower() == "transfer-encoding" and v.lower() == "chunked" for k, v in headers)
    async for piece in _body_pieces(up_reader, headers, watcher):
        client.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
        await client.drain()
    if chunked:
        client.write(b"0\r\n\r\n")
        await client.drain()
    return not any(k.lower() == "connection" and v.lower() == "close" for k, v in headers) and status < 500
