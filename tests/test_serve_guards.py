"""Issue 24, fast checks of the serving guards without a model: the connection caps of the HTTP
fronts (a real aiohttp server on loopback), the preloaded library that keeps tritonserver's key off
its command line and makes it die with its supervisor (compiled with the real cc, run on real
processes), the prompt byte limit from the context, and what a SIGKILLed serve's pid file lets the
next one end."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from trtbuild.serve import server as server_mod
from trtbuild.serve.listener import Limits, Listener, handler_settings
from trtbuild.serve.server import build_shim, end_orphans, group_members, write_pid_file

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")


def _closed_by_server(sock: socket.socket, timeout: float = 3.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_listener_evicts_the_oldest_idle_connection_and_refuses_when_all_are_busy() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def slow(request: web.Request) -> web.Response:
            await release.wait()
            return web.Response(text="done")

        listener = Listener(Limits(total=10, per_client=2))
        app = web.Application(middlewares=[listener.middleware])
        app.router.add_get("/slow", slow)
        app.router.add_get("/fast", lambda request: asyncio.sleep(0, web.Response(text="ok")))
        runner = web.AppRunner(app, **handler_settings())
        await runner.setup()
        port = listener.bind("127.0.0.1", 0)
        listener.start(runner.server)
        loop = asyncio.get_running_loop()

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port))

        try:
            idle = [await loop.run_in_executor(None, connect) for _ in range(2)]
            await asyncio.sleep(0.2)
            third = await loop.run_in_executor(None, connect)  # at the cap: the oldest idle one goes
            await asyncio.sleep(0.2)
            assert await loop.run_in_executor(None, _closed_by_server, idle[0])
            assert listener.evicted == 1 and listener.open_count() == 2
            for sock in (idle[1], third):
                sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(0.3)
            fourth = await loop.run_in_executor(None, connect)  # both busy: the newcomer is refused
            assert await loop.run_in_executor(None, _closed_by_server, fourth)
            assert listener.refused == 1
            release.set()
            for sock in (idle[1], third):
                answer = await loop.run_in_executor(None, sock.recv, 4096)
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"done")
            for sock in (*idle, third, fourth):
                sock.close()
        finally:
            await listener.close()
            await runner.cleanup()

    asyncio.run(main())


def test_limits_follow_the_open_file_limit() -> None:
    small, large = Limits.from_fd_limit(1024), Limits.from_fd_limit(65536)
    # every front's connections, each with an upstream one, fit beside the reserve
    assert 3 * 2 * small.total + 128 <= 1024 and small.per_client < small.total
    assert large.total > small.total


def test_prompt_byte_limit_is_the_context_times_the_longest_token() -> None:
    from trtbuild.serve.textgen import prompt_byte_limit

    class Vocab:
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0, "hello": 1, "ü": 2}

    assert prompt_byte_limit(Vocab(), 256, 1 << 20) == 256 * 5
    assert prompt_byte_limit(Vocab(), 256, 1000) == 1000  # the deployment's own cap wins when smaller


@needs_cc
def test_preloaded_library_fills_the_key_in_and_keeps_it_off_the_command_line(tmp_path: Path) -> None:
    shim = build_shim(tmp_path)
    assert shim is not None and shim.is_file()
    probe = ("import os, sys; print(sys.argv[1]); print(open('/proc/self/cmdline', 'rb').read().decode()); "
             "print(os.environ.get('TRTBUILD_SECRET0'), os.environ.get('LD_PRELOAD'))")
    env = {**os.environ, "LD_PRELOAD": str(shim), "TRTBUILD_SECRET0": "s3cr3t"}
    out = subprocess.run([sys.executable, "-c", probe, "--key=x:k=@@TRTBUILD_SECRET0@@"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert out[0] == "--key=x:k=s3cr3t"  # what the program reads
    assert "@@TRTBUILD_SECRET0@@" in out[1] and "s3cr3t" not in out[1]  # what /proc shows everyone
    assert out[2] == "None None"  # nor passed on to its children
    env["TRTBUILD_LD_PRELOAD_REST"] = "libkept.so"  # a preload of the user's own stays for the children
    out = subprocess.run([sys.executable, "-c", probe, "x"], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()
    assert out[2] == "None libkept.so"


@needs_cc
def test_preloaded_library_makes_the_child_die_with_its_parent(tmp_path: Path) -> None:
    shim = build_shim(tmp_path)
    assert shim is not None
    pid_file = tmp_path / "child.pid"
    parent = ("import os, subprocess, sys, time; "
              "env = {**os.environ, 'LD_PRELOAD': sys.argv[1], 'TRTBUILD_PARENT_PID': str(os.getpid())}; "
              "child = subprocess.Popen(['sleep', '300'], env=env, start_new_session=True); "
              "open(sys.argv[2], 'w').write(str(child.pid)); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", parent, str(shim), str(pid_file)])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        child = int(pid_file.read_text())
        time.sleep(0.3)
        assert group_members(child) == [child]
        proc.kill()  # as the OOM killer would
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while group_members(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(child) == []
    finally:
        proc.kill()


def test_the_next_serve_ends_what_a_killed_one_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    # a process group that looks like a left-over python-backend stub, whose supervisor is gone
    fake = tmp_path / "triton_python_backend_stub"
    fake.symlink_to(shutil.which("sleep"))
    leftover = subprocess.Popen([str(fake), "300"], start_new_session=True)
    supervisor = subprocess.Popen([sys.executable, "-c", "pass"])
    supervisor.wait()
    try:
        monkeypatch.setattr(server_mod.os, "getpid", lambda: supervisor.pid)
        write_pid_file(18000, leftover.pid, "trtbuild_test_")
        monkeypatch.undo()
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
        record = json.loads((server_mod.pid_dir() / "serve-18000.json").read_text())
        assert record["tritonserver"] == leftover.pid
        # a live supervisor's record is left alone
        live = server_mod.pid_dir() / "serve-18001.json"
        live.write_text(json.dumps({**record, "supervisor": os.getpid(),
                                    "supervisor_start": server_mod._start_time(os.getpid())}))
        assert end_orphans() == [leftover.pid]
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert not (server_mod.pid_dir() / "serve-18000.json").exists() and live.exists()
    finally:
        leftover.kill()
