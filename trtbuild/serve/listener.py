"""The listening side of trtbuild's fronts: the Triton HTTP front and the OpenAI front (aiohttp), and
the gRPC front (its connections relayed as bytes to grpcio, trtbuild.serve.grpc_front).

aiohttp does the HTTP (parsing, keep-alive, chunking, HTTP/1.0) and these of its own settings
bound what one connection may cost: `keepalive_timeout` closes a connection that has not sent a
whole request head in that time (idle keep-alive and slow headers alike), `max_line_size` /
`max_field_size` / `max_headers` bound the head, `client_max_size` the body, `lingering_time` what
is read after a refusal, `handler_cancellation` cancels the handler of a request whose client went
away. aiohttp has no cap on connections, so the accept loop here is ours: it hands accepted
sockets to aiohttp (`loop.connect_accepted_socket`) and keeps the number of open connections under
a total and a per-client cap, both derived from the open-file limit. At a cap the oldest *idle*
connection (no request in flight) of that client (or of anyone, for the total) is closed to make
room; when every connection is busy the new one is closed instead. Running out of file
descriptors anyway (EMFILE) pauses accepting briefly; it never ends the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

HEAD_TIMEOUT_S = 15.0  # aiohttp keepalive_timeout: whole request head (or the next one) within this
BODY_TIMEOUT_S = 30.0  # the whole body within this once the head is in
LINGER_S = 2.0  # after refusing a body: how long aiohttp still reads what the client sends (default 10)
MAX_LINE = 8190
MAX_FIELD = 8190
MAX_HEADERS = 64
RESERVED_FDS = 128  # logs, /proc and /dev/shm scans, model config reads, tritonserver's pipes
FRONTS = 3  # Triton HTTP, OpenAI, gRPC: they share the process's file descriptors


def handler_settings() -> dict[str, Any]:
    """aiohttp server settings both HTTP fronts run with (AppRunner keyword arguments)."""
    return {"keepalive_timeout": HEAD_TIMEOUT_S, "max_line_size": MAX_LINE, "max_field_size": MAX_FIELD,
            "max_headers": MAX_HEADERS, "handler_cancellation": True, "access_log": None,
            "lingering_time": LINGER_S}


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard one (what the process may use); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass(frozen=True)
class Limits:
    total: int
    per_client: int

    @classmethod
    def from_fd_limit(cls, nofile: int | None = None) -> Limits:
        """Each accepted connection may hold one upstream connection too (2 fds); the fronts share."""
        nofile = nofile or resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        total = max(16, min(4096, (nofile - RESERVED_FDS) // (2 * FRONTS)))
        return cls(total=total, per_client=max(8, total // 2))


@dataclass
class _Conn:
    transport: asyncio.Transport
    client: str
    opened: float
    busy: int = 0  # requests in flight
    active: float = 0.0  # last time bytes passed (connections relayed as bytes: the gRPC front)


@dataclass
class Listener:
    """Accepts on one socket and hands connections to a protocol factory (an aiohttp `web.Server`,
    or the gRPC front's byte relay) within the limits."""

    limits: Limits
    conns: dict[asyncio.Transport, _Conn] = field(default_factory=dict)
    refused: int = 0  # connections closed at once (every one of that client's was busy)
    evicted: int = 0  # idle connections closed to make room
    _task: asyncio.Task[None] | None = None
    _sock: socket.socket | None = None

    def bind(self, host: str, port: int) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
        self._sock = sock
        return sock.getsockname()[1]

    def start(self, server: Callable[[], asyncio.BaseProtocol]) -> None:
        self._task = asyncio.ensure_future(self._accept(server))

    def touch(self, transport: asyncio.BaseTransport | None) -> None:
        """Bytes passed on this connection: not idle for a second (see `_evict`)."""
        conn = self.conns.get(transport) if transport is not None else None  # type: ignore[arg-type]
        if conn is not None:
            conn.active = time.monotonic()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def open_count(self) -> int:
        self._prune()
        return len(self.conns)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Marks the connection busy while a request is in flight (idle ones may be evicted)."""
        conn = self.conns.get(request.transport) if request.transport is not None else None  # type: ignore[arg-type]
        if conn is not None:
            conn.busy += 1
        try:
            response = await handler(request)
            if request.get(_UNREADABLE_BODY):
                response.force_close()  # the rest of the connection's bytes cannot be trusted either
            return response
        finally:
            if conn is not None:
                conn.busy -= 1

    # -- the accept loop ---------------------------------------------------------------------
    async def _accept(self, server: Callable[[], asyncio.BaseProtocol]) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                sock, address = await loop.sock_accept(self._sock)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._prune()
                    await asyncio.sleep(0.1)  # out of descriptors: wait for some to close
                continue
            client = address[0] if isinstance(address, tuple) else str(address)
            if not self._make_room(client):
                self.refused += 1
                sock.close()
                continue
            try:
                transport, _ = await loop.connect_accepted_socket(server, sock)
            except OSError:
                sock.close()
                continue
            self.conns[transport] = _Conn(transport, client, time.monotonic())  # type: ignore[arg-type]

    def _prune(self) -> None:
        for transport in [t for t in self.conns if t.is_closing()]:
            del self.conns[transport]

    def _make_room(self, client: str) -> bool:
        self._prune()
        mine = [c for c in self.conns.values() if c.client == client]
        if len(mine) >= self.limits.per_client and not self._evict(mine):
            return False
        return len(self.conns) < self.limits.total or self._evict(list(self.conns.values()))

    def _evict(self, candidates: list[_Conn]) -> bool:
        now = time.monotonic()
        idle = [c for c in candidates if c.busy == 0 and now - c.active > 1.0]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.opened)
        oldest.transport.abort()
        del self.conns[oldest.transport]
        self.evicted += 1
        return True


_UNREADABLE_BODY = "trtbuild.unreadable_body"  # request key: answer, then close the connection


class BodyError(Exception):
    """A body that cannot be read: undecodable Content-Encoding (br without brotli, bad deflate)."""


async def read_body(request: web.Request, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The request body within `client_max_size` and `timeout_s` (a slow body is a 408)."""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except TimeoutError:
        raise web.HTTPRequestTimeout(text=f"the body did not arrive within {timeout_s:.0f} s") from None
    except (web.RequestPayloadError, HttpProcessingError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, HttpProcessingError) else exc
        message = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
        # Nothing more of this body is read: without this, aiohttp reads on to drain it after the
        # answer, meets the same decoding error and logs it as a 40-line "Unhandled exception".
        request[_UNREADABLE_BODY] = True
        request.content.feed_eof()
        raise BodyError(f"the request body cannot be decoded: {str(message).strip()}") from None
