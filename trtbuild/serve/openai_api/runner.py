"""Runs the OpenAI front on its own thread and event loop, beside the Triton server it fronts.

`trtbuild serve` / `demo` start it once Triton is ready and stop it first on shutdown: it stops
accepting, lets in-flight requests finish (they still need Triton), then Triton drains.
Connections are bounded by aiohttp's own settings and trtbuild.serve.listener's caps (the same
as the Triton front's): head and keep-alive timeout, body timeout, connections in total and per
client; a client that goes away cancels its request (aiohttp's handler_cancellation).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from trtbuild.core.errors import UserError
from trtbuild.serve.listener import Limits, Listener, handler_settings
from trtbuild.serve.openai_api.app import FrontConfig, create_app

HOST = "127.0.0.1"


class OpenAIFront:
    def __init__(self, config: FrontConfig, port: int = 0, host: str = HOST, drain_timeout_s: float = 30.0) -> None:
        self.config, self.host, self.port = config, host, port
        self.drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: Any = None
        self._listener: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL OpenAI clients take (`OpenAI(base_url=...)`)."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> OpenAIFront:
        from aiohttp import web

        ready = threading.Event()
        failure: list[BaseException] = []
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._listener = Listener(Limits.from_fd_limit())
            self.port = self._listener.bind(self.host, self.port)
            self._runner = web.AppRunner(create_app(self.config, self._listener.middleware),
                                         shutdown_timeout=self.drain_timeout_s, **handler_settings())
            await self._runner.setup()
            self._listener.start(self._runner.server)

        def main() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(serve())
            except BaseException as exc:  # reported by start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, name="trtbuild-openai", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            if isinstance(failure[0], OSError):
                raise UserError(f"cannot listen on {self.host}:{self.port}: {failure[0].strerror}",
                                field="deploy.openai_port", fix="choose another port (0 picks a free one)")
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stops accepting, waits up to drain_timeout_s for in-flight requests, closes."""
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        async def shutdown() -> None:
            await self._listener.close()
            await runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(self.drain_timeout_s + 10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._loop = self._runner = None

    def __enter__(self) -> OpenAIFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
