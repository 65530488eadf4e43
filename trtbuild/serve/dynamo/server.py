"""`trtbuild serve RECIPE --engine dynamo --workers N`: the CPU rehearsal behind NVIDIA Dynamo's real frontend.

Processes (every socket on 127.0.0.1; no etcd or NATS):
  python -m dynamo.frontend   Dynamo's OpenAI frontend and router (chat template, tokenizer, detokenizer, stop
                              strings), file discovery in a fresh directory, TCP request plane, and request
                              migration (a request whose worker dies goes to another one)
  N x python -m trtbuild.serve.dynamo.worker   the project's runtime with in-flight batching and speculative
                              decoding, one process each, registered with ModelInput.Tokens

Every child gets PR_SET_PDEATHSIG (SIGKILL): a SIGKILLed `serve` leaves nothing running. HOME points at the run's
own directory, where Dynamo writes its tokenizer copy (~/.cache/dynamo), removed with it at the end.

A worker that dies is started again (its discovery entries are removed first, so the router stops choosing it);
the frontend migrates what was in flight on it. Stopping (SIGINT / SIGTERM): the workers stop taking requests and
finish those in flight (Dynamo's graceful shutdown) for up to deploy.exit_timeout_s, then the frontend stops;
anything still alive after that is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError, UserError

NAMESPACE = "trtbuild"
ENDPOINT = f"{NAMESPACE}.backend.generate"
MIGRATION_LIMIT = 3
MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
_PR_SET_PDEATHSIG = 1
STATE_PREFIX = "trtbuild-dynamo-"  # + the serve's pid: a run's discovery files, logs and HOME


def remove_stale_state() -> list[Path]:
    """The run directories a SIGKILLed `serve` left (its children died with it: PR_SET_PDEATHSIG)."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{STATE_PREFIX}*-*"):
        try:
            pid = int(path.name[len(STATE_PREFIX):].split("-", 1)[0])
            if path.stat().st_uid != os.getuid() or path.is_symlink():
                continue
        except (ValueError, OSError):
            continue
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.setsid()  # its own session: the terminal's Ctrl-C reaches serve, which drains in order


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    deaths: list[float] = field(default_factory=list)

    def start(self, env: dict[str, str]) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, preexec_fn=_die_with_parent)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def how_it_ended(self) -> str:
        assert self.proc is not None
        code = self.proc.returncode
        return f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"

    def signal(self, sig: int) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)  # its session = its process group

    def wait(self, timeout_s: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


def _free_port() -> int:
    from trtbuild.serve.server import free_port

    return free_port()


def _get_json(url: str, timeout_s: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (127.0.0.1 only)
        return json.loads(response.read())


class DynamoServe:
    def __init__(self, model_dir: Path, model_name: str, *, workers: int, http_port: int, exit_timeout_s: int,
                 echo: Callable[[str], None] = print) -> None:
        if workers < 1:
            raise UserError(f"--workers {workers}: at least one worker is needed", field="--workers",
                            fix="pass --workers 1 or more")
        self.model_dir, self.model_name, self.exit_timeout_s, self.echo = model_dir, model_name, exit_timeout_s, echo
        self.http_port = http_port or _free_port()
        self.state = Path(tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{os.getpid()}-"))
        (self.state / "kv").mkdir()
        (self.state / "home").mkdir()
        self.env = self._env()
        self.frontend = Child("frontend", [
            sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
            "--discovery-backend", "file", "--request-plane", "tcp", "--namespace", NAMESPACE,
            "--router-mode", "round-robin", "--migration-limit", str(MIGRATION_LIMIT)], self.state / "frontend.log")
        self.workers = [Child(f"worker {i}", [
            sys.executable, "-m", "trtbuild.serve.dynamo.worker", str(model_dir), "--model-name", model_name,
            "--endpoint", ENDPOINT, "--state-dir", str(self.state)], self.state / f"worker-{i}.log")
            for i in range(workers)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        home = os.environ.get("HOME", str(Path.home()))
        env.setdefault("HF_HOME", str(Path(home) / ".cache" / "huggingface"))  # the user's, not the run's
        env.update({
            "HOME": str(self.state / "home"),  # Dynamo's tokenizer copy (~/.cache/dynamo) stays in this run
            "DYN_FILE_KV": str(self.state / "kv"), "DYN_DISCOVERY_BACKEND": "file", "DYN_REQUEST_PLANE": "tcp",
            "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
            "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SELF_HOST_METADATA": "0", "DYN_LOG": env.get("DYN_LOG", "warn"),
        })
        root = str(Path(__file__).resolve().parents[3])  # the trtbuild that started serve, first
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def _instances(self) -> list[Path]:
        return [p for p in (self.state / "kv").rglob("*") if p.is_file()]

    def _worker_entries(self, pid: int) -> list[Path]:
        """The discovery entries of one worker (each names the instance id the worker printed)."""
        marker = self._read_instance(pid)
        return [p for p in self._instances() if marker and p.name.endswith(marker)]

    def _read_instance(self, pid: int) -> str | None:
        path = self.state / f"instance-{pid}"
        with contextlib.suppress(OSError):
            return path.read_text().strip() or None
        return None

    def _ready_workers(self) -> int:
        try:
            models = _get_json(f"{self.url}/models").get("data", [])
        except (OSError, ValueError):
            return 0
        if not any(m.get("id") == self.model_name for m in models):
            return 0
        registered = {p.name for p in self._instances() if p.parent.name == "instances"}
        return sum(1 for w in self.workers if w.running() and (marker := self._read_instance(w.pid))
                   and any(name.endswith(marker) for name in registered))

    def _wait_ready(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._ready_workers() < count:
            for child in [self.frontend, *self.workers]:
                if not child.running():
                    raise BuildError(f"dynamo {child.name} ended before it was ready ({child.how_it_ended()}): "
                                     f"{_tail(child.log)}", fix=f"see {child.log}")
            if time.monotonic() > deadline:
                raise BuildError(f"dynamo: {self._ready_workers()} of {count} workers ready after {timeout_s:.0f} s",
                                 fix=f"see the logs in {self.state}")
            time.sleep(0.2)

    def start(self, ready_timeout_s: float) -> None:
        self.frontend.start(self.env)
        for worker in self.workers:
            worker.start(self.env)
        self._wait_ready(len(self.workers), ready_timeout_s)

    def supervise_once(self, ready_timeout_s: float) -> None:
        if not self.frontend.running():
            raise BuildError(f"the Dynamo frontend died ({self.frontend.how_it_ended()}): {_tail(self.frontend.log)}",
                             fix=f"see {self.frontend.log}")
        for worker in self.workers:
            if worker.running():
                continue
            dead = worker.pid
            stale = self._worker_entries(dead)
            for entry in stale:  # the router must stop choosing it (file discovery keeps them otherwise)
                with contextlib.suppress(OSError):
                    entry.unlink()
            now = time.monotonic()
            worker.deaths = [t for t in worker.deaths if now - t < RESTART_WINDOW_S] + [now]
            if len(worker.deaths) > MAX_RESTARTS:
                raise BuildError(f"dynamo {worker.name} died {len(worker.deaths)} times in {RESTART_WINDOW_S:.0f} s; "
                                 f"the last time: {worker.how_it_ended()}", fix=f"see {worker.log}")
            self.echo(f"dynamo {worker.name} (pid {dead}) died ({worker.how_it_ended()}); restarting "
                      f"({len(worker.deaths)}/{MAX_RESTARTS})")
            worker.start(self.env)
            self._wait_ready(sum(1 for w in self.workers if w.running()), ready_timeout_s)
            self.echo(f"dynamo {worker.name} ready again (pid {worker.pid})")

    def stop(self) -> int:
        """Drain: workers finish what they have (up to exit_timeout_s), then the frontend; the rest is killed."""
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.exit_timeout_s
        clean = all(w.wait(deadline - time.monotonic()) for w in self.workers)
        for worker in self.workers:
            worker.kill()
        self.frontend.signal(signal.SIGTERM)
        clean = self.frontend.wait(10) and clean
        self.frontend.kill()
        return 0 if clean else 1

    def cleanup(self) -> None:
        for child in [*self.workers, self.frontend]:
            child.kill()
        shutil.rmtree(self.state, ignore_errors=True)


def _tail(path: Path, lines: int = 3) -> str:
    with contextlib.suppress(OSError):
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        return " | ".join(text[-lines:])[-600:]
    return "(no log)"


def serve_dynamo(model_dir: Path, model_name: str, *, workers: int = 1, http_port: int = 0, exit_timeout_s: int = 30,
                 echo: Callable[[str], None] = print, ready_timeout_s: float = 300.0,
                 stop_event: threading.Event | None = None) -> int:
    """Start, print the endpoint, block until SIGINT/SIGTERM (or stop_event), drain and stop; the exit code."""
    stop = stop_event or threading.Event()
    remove_stale_state()
    served = DynamoServe(model_dir, model_name, workers=workers, http_port=http_port, exit_timeout_s=exit_timeout_s,
                         echo=echo)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        served.start(ready_timeout_s)
        echo(f"dynamo frontend ready (pid {served.frontend.pid}, {len(served.workers)} workers: "
             f"{', '.join(str(w.pid) for w in served.workers)}); Ctrl-C stops it")
        echo(f"  OpenAI  {served.url}  (model '{model_name}')")
        while not stop.wait(0.5):
            served.supervise_once(ready_timeout_s)
        echo("stopping: draining in-flight requests ...")
        code = served.stop()
        echo(f"dynamo stopped (exit code {code})")
        return code
    finally:
        served.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_dynamo_deployment(deploy_dir: Path, *, workers: int = 1, openai_port: int | None = None,
                            echo: Callable[[str], None] = print, stop_event: threading.Event | None = None) -> int:
    """The deployment's local repository behind Dynamo: the OpenAI API on deploy.openai_port (0: a free port)."""
    from trtbuild.serve.commands import local_model_dir

    model_dir, info = local_model_dir(deploy_dir)
    port = info["ports"].get("openai", 8003) if openai_port is None else openai_port
    return serve_dynamo(model_dir, str(info["model_name"]), workers=workers, http_port=port,
                        exit_timeout_s=int(info.get("exit_timeout_s", 30)), echo=echo, stop_event=stop_event)
