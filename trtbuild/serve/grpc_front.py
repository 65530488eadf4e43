"""The gRPC front: a pass-through proxy (grpcio's asyncio server and channel) before tritonserver's gRPC port.

tritonserver 2.51 takes gRPC messages of any size (it has no option to bound them): a 1 GiB prompt
was received whole, held by tritonserver and its stub. Here grpcio's own `max_receive_message_length`
refuses an oversize message (RESOURCE_EXHAUSTED) before it is passed on, `maximum_concurrent_rpcs`
bounds the calls in flight, a connection that does not finish its HTTP/2 handshake in 10 s
or stays idle for 5 minutes is closed (grpcio's server settings), and every call goes upstream
with the secret header of tritonserver's restricted protocols (only the fronts hold it). Messages
are relayed as bytes, never decoded. A client that cancels (or disconnects) cancels its handler,
and so the upstream call: tritonserver then cancels the request, and the model drops it from its
batch.

grpcio accepts connections by itself, without a cap, so 2,000 idle connections would take every
file descriptor of the process (the HTTP fronts' too). The public port is therefore held by
trtbuild.serve.listener (the same caps as the HTTP fronts, from the open-file limit), which relays
each connection's bytes to the grpcio server on a unix socket in a private directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from trtbuild.serve.listener import Limits, Listener

_STREAMING = {"/inference.GRPCInferenceService/ModelStreamInfer"}
UPSTREAM_MAX_MESSAGE = 256 << 20  # answers from tritonserver (text: small)
HANDSHAKE_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 300.0  # clients (tritonclient) reconnect by themselves


class GrpcFront:
    """Runs its own asyncio loop in a thread; `start()` binds the public port."""

    def __init__(self, host: str, port: int, upstream_port: int, *, max_message: int,
                 upstream_metadata: dict[str, str], limits: Limits) -> None:
        self.host, self.port, self.upstream_port = host, port, upstream_port
        self.max_message, self.max_calls = max_message, limits.total
        self.listener = Listener(limits)
        self._dir = Path(tempfile.mkdtemp(prefix="trtbuild-grpc-"))  # 0700: only this user connects
        self._socket = self._dir / "grpc.sock"
        self.metadata = tuple(upstream_metadata.items())
        self._secret_keys = {k.lower() for k in upstream_metadata}
        self._loop = asyncio.new_event_loop()
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._thread: threading.Thread | None = None
        self.problem: Callable[[], str | None] = lambda: None  # why no call may go upstream now (UNAVAILABLE)

    def start(self) -> None:
        self.port = self.listener.bind(self.host, self.port)
        self._loop.run_until_complete(self._setup())
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtbuild-grpc-front", daemon=True)
        self._thread.start()

    def _new_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(
            f"127.0.0.1:{self.upstream_port}",
            options=[("grpc.max_receive_message_length", UPSTREAM_MAX_MESSAGE),
                     ("grpc.max_send_message_length", self.max_message)])

    async def _setup(self) -> None:
        self._channel = self._new_channel()
        self._server = grpc.aio.server(
            handlers=[_Proxy(self)], maximum_concurrent_rpcs=self.max_calls,
            options=[("grpc.max_receive_message_length", self.max_message),
                     ("grpc.max_send_message_length", UPSTREAM_MAX_MESSAGE),
                     ("grpc.so_reuseport", 0),
                     # a connection that never speaks HTTP/2, or stays idle, gives its descriptor back
                     ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
                     ("grpc.max_connection_idle_ms", int(IDLE_TIMEOUT_S * 1000))])
        if self._server.add_insecure_port(f"unix:{self._socket}") == 0:
            raise OSError(f"cannot listen on {self._socket}")
        await self._server.start()
        self.listener.start(lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=1 << 16), self._relay))

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """One public connection's bytes to and from the grpcio server, as they come."""
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(self._socket))
        except OSError:
            client_writer.close()
            return
        transport = client_writer.transport

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(1 << 16):
                    self.listener.touch(transport)
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pump(client_reader, up_writer), pump(up_reader, client_writer), return_exceptions=True)

    def retarget(self, upstream_port: int) -> None:
        """Relay to tritonserver on another port (it was restarted there)."""
        async def reconnect() -> None:
            old, self.upstream_port = self._channel, upstream_port
            self._channel = self._new_channel()
            if old is not None:
                await old.close()

        asyncio.run_coroutine_threadsafe(reconnect(), self._loop).result(timeout=10)

    def close(self, grace_s: float = 5.0) -> None:
        if self._thread is None:
            return

        async def shutdown() -> None:
            await self.listener.close()
            if self._server is not None:
                await self._server.stop(grace_s)
            if self._channel is not None:
                await self._channel.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=grace_s + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None
        self._loop.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- calls -------------------------------------------------------------------------------
    def metadata_for(self, context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
        theirs = tuple((k, v) for k, v in (context.invocation_metadata() or ())
                       if k.lower() not in self._secret_keys and not k.startswith("grpc-"))
        return theirs + self.metadata

    async def _check_up(self, context: grpc.aio.ServicerContext) -> None:
        problem = self.problem()
        if problem is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, problem)

    async def unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        assert self._channel is not None
        await self._check_up(context)
        call = self._channel.unary_unary(method)(request, metadata=self.metadata_for(context),
                                                 timeout=context.time_remaining())
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        finally:
            call.cancel()  # a no-op once done; cancels upstream when this handler is cancelled
        raise AssertionError("unreachable")

    async def stream(self, method: str, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        assert self._channel is not None
        await self._check_up(context)
        call = self._channel.stream_stream(method)(requests, metadata=self.metadata_for(context),
                                                   timeout=context.time_remaining())
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        finally:
            call.cancel()


class _Proxy(grpc.GenericRpcHandler):
    def __init__(self, front: GrpcFront) -> None:
        self.front = front

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method in _STREAMING:
            async def stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
                async for response in self.front.stream(method, requests, context):
                    yield response

            return grpc.stream_stream_rpc_method_handler(stream)

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self.front.unary(method, request, context)

        return grpc.unary_unary_rpc_method_handler(unary)
