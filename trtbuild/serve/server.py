"""Run the `tritonserver` bundled in the nvidia-pytriton wheel directly on our model repositories.

What PyTriton does to start its bundled server, and so what we do (pytriton/triton.py,
pytriton/server/triton_server.py):
- the python backend looks for `triton_python_backend_stub` next to `libtriton_python.so` in the
  backend directory; the wheel ships one stub per Python version in `python_backend_stubs/<x.y>/`,
  so we assemble a backend directory (symlinks) holding the stub of the running interpreter;
- the server's shared libraries live in `nvidia_pytriton.libs`, added to LD_LIBRARY_PATH; the stub
  embeds libpython, so the running interpreter's libdir goes first on LD_LIBRARY_PATH;
- the stub's interpreter finds its prefix from PATH: the environment's `bin` goes first, which
  makes the stub use this virtual environment's site-packages (torch, the runtime).

The server binds 127.0.0.1 only, and clients reach it only through trtbuild's fronts, which hold
the public ports: HTTP (trtbuild.serve.front: body size, JSON depth, routes, field types,
cancellation of abandoned requests, connection caps) and gRPC (trtbuild.serve.grpc_front: message
size, cancellation). tritonserver's own ports are free ports on 127.0.0.1, which any local user
could reach, so every API there is restricted (--http-restricted-api / --grpc-restricted-protocol)
to a header whose value only the fronts hold; the shared-memory, model-repository, logging and trace
APIs to a second one nobody holds. Neither value is on tritonserver's command line (world-readable
in /proc): a small preloaded library (native/argv_secrets.c) fills them in from the environment.
tritonserver runs with umask 077 (its shared-memory regions are private to its user) and names its
python-backend regions with a prefix of its own.

tritonserver dies with its supervisor (the same library sets PR_SET_PDEATHSIG), and a pid file per
HTTP port lets the next `serve` end what a SIGKILLed one left (its stubs) before it binds the ports.

Stopping (SIGINT/SIGTERM to `serve`): the front refuses new requests, tritonserver gets SIGINT and
finishes the requests in flight for up to `exit_timeout_s`; when that time is up the drain file is
created and the model cuts what still runs (trtbuild.deploy.local_model), so tritonserver never hits
its own exit timeout with requests in flight (2.51 then crashed and left /dev/shm regions behind).
Anything of its process group still alive after that is killed and its /dev/shm regions removed, so
no child and no region outlives `stop`. `serve` restarts a tritonserver that died, saying why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError, TrtbuildError, UserError
from trtbuild.serve.ownership import holds_ports

HOST = "127.0.0.1"
DRAIN_MARGIN_S = 15  # after the drain file: time for the model to cut its requests and unload
PORT_RETRIES = 3  # fresh internal ports after tritonserver lost one to another process
MAX_BODY_BYTES = 8 << 20
MAX_JSON_DEPTH = 32
ADMIN_APIS = "shared-memory,model-repository,logging,trace"  # nobody: the key is never sent
FRONT_APIS = "health,metadata,inference,model-config,statistics"  # the fronts: they send the key
FRONT_KEY_HEADER = "trtbuild-front-key"
ADMIN_KEY_HEADER = "trtbuild-admin-key"
SHIM_SOURCE = Path(__file__).with_name("native") / "argv_secrets.c"
# Error lines every CPU-only start prints; they are not why a start failed.
_BENIGN = ("CudaDriverHelper has not been initialized",)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the trtbuild package


@dataclass(frozen=True)
class TritonDist:
    """Where the bundled server's pieces are."""

    root: Path  # pytriton/tritonserver
    libs: Path  # nvidia_pytriton.libs

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    def stub(self, version: str | None = None) -> Path:
        version = version or f"{sys.version_info[0]}.{sys.version_info[1]}"
        return self.root / "python_backend_stubs" / version / "triton_python_backend_stub"


def find_dist() -> TritonDist:
    """Locate the tritonserver of the installed nvidia-pytriton wheel."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("nvidia-pytriton is not installed, so there is no local tritonserver",
                        fix="pip install nvidia-pytriton (it bundles tritonserver and the python backend)")
    package = Path(next(iter(spec.submodule_search_locations)))
    dist = TritonDist(root=package / "tritonserver", libs=package.parent / "nvidia_pytriton.libs")
    if not dist.libs.is_dir():  # editable installs keep the libraries inside the package
        dist = TritonDist(root=dist.root, libs=dist.root / "external_libs")
    if not dist.binary.is_file():
        raise UserError(f"no tritonserver binary at {dist.binary}", fix="reinstall nvidia-pytriton")
    if not dist.stub().is_file():
        raise UserError(f"nvidia-pytriton has no python backend stub for Python "
                        f"{sys.version_info[0]}.{sys.version_info[1]}", fix="use Python 3.8 to 3.13")
    return dist


@dataclass(frozen=True)
class Endpoints:
    http_port: int
    grpc_port: int
    metrics_port: int
    host: str = HOST

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def lines(self, models: Sequence[str] = ()) -> list[str]:
        out = [f"HTTP     http://{self.http}  (KServe v2: /v2/models/<model>/infer, "
               "/generate, /generate_stream)",
               f"gRPC     {self.grpc}  (KServe v2 + streaming)",
               f"metrics  {self.metrics}"]
        for name in models:
            out.append(f"model    {name}: POST http://{self.http}/v2/models/{name}/generate "
                       "'{\"text_input\": \"...\", \"max_tokens\": 32}'")
        return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((HOST, port)) == 0


def server_env(dist: TritonDist) -> dict[str, str]:
    env = os.environ.copy()
    libdir = sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, str(dist.libs), env.get("LD_LIBRARY_PATH"))
                                             if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.prefix) / "bin"), env.get("PATH", "")))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env.pop("PYTHONHOME", None)
    return env


def prepare_backends(dist: TritonDist, where: Path) -> Path:
    """A backend directory with the python backend and the stub matching this interpreter."""
    python = where / "backends" / "python"
    python.mkdir(parents=True, exist_ok=True)
    src = dist.root / "backends" / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (python / name).symlink_to(src / name)
    (python / "triton_python_backend_stub").symlink_to(dist.stub())
    return where / "backends"


class TritonServer:
    """One tritonserver process on 127.0.0.1 behind the validating front (HTTP). Use as a context
    manager or start()/stop()."""

    def __init__(self, repositories: Sequence[Path], *, http_port: int = 8000, grpc_port: int = 8001,
                 metrics_port: int = 8002, log_file: Path | None = None, exit_timeout_s: int = 30,
                 auto_complete_config: bool = False, log_verbose: int = 0, front: bool = True,
                 max_body_bytes: int = MAX_BODY_BYTES, max_json_depth: int = MAX_JSON_DEPTH) -> None:
        self.repositories = [Path(r).resolve() for r in repositories]
        ports = [p or free_port() for p in (http_port, grpc_port, metrics_port)]
        self._auto_metrics_port = not metrics_port
        self.endpoints = Endpoints(*ports)
        self.exit_timeout_s = exit_timeout_s
        self.auto_complete_config = auto_complete_config
        self.log_verbose = log_verbose
        self._log_file = log_file
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._log_start = 0  # where this launch's lines begin in the log
        self.last_pid: int | None = None  # the server's pid (and process group), kept after stop()
        self._failed = False
        self._admin_key = secrets.token_hex(16)  # unlocks the admin APIs: never sent
        self._front_key = secrets.token_hex(16)  # unlocks the rest: only the fronts send it
        self.shm_prefix = f"trtbuild_{secrets.token_hex(6)}_"
        self._front: Any = None
        self._grpc_front: Any = None
        self._front_options = (max_body_bytes, max_json_depth) if front else None
        self.triton_http_port = free_port() if front else self.endpoints.http_port
        self.triton_grpc_port = free_port() if front else self.endpoints.grpc_port
        self.warnings: list[str] = []
        self._problem: tuple[float, str | None] = (0.0, None)
        self._ready = False  # tritonserver answered ready on ports it holds itself (see _wait_ready)

    @property
    def upstream_headers(self) -> dict[str, str]:
        """What a front sends with each request to tritonserver's own ports."""
        return {FRONT_KEY_HEADER: self._front_key}

    @property
    def upstream_metadata(self) -> dict[str, str]:
        """The same for gRPC: tritonserver expects the key prefixed (triton-grpc-protocol-<key>)."""
        return {f"triton-grpc-protocol-{FRONT_KEY_HEADER}": self._front_key}

    @property
    def triton_http(self) -> str:
        """tritonserver's own HTTP endpoint (needs `upstream_headers`)."""
        return f"{HOST}:{self.triton_http_port}"

    # -- lifecycle ---------------------------------------------------------------------------
    def command(self, backend_dir: Path, dist: TritonDist, secret: Callable[[int], str] | None = None) -> list[str]:
        """tritonserver's argv; `secret(n)` writes the n-th secret (default: a placeholder the
        preloaded library fills in, see native/argv_secrets.c)."""
        secret = secret or (lambda n: f"@@TRTBUILD_SECRET{n}@@")
        cmd = [str(dist.binary)]
        for repo in self.repositories:
            cmd.append(f"--model-repository={repo}")
        cmd += [
            f"--backend-directory={backend_dir}",
            f"--http-address={HOST}", f"--http-port={self.triton_http_port}",
            f"--grpc-address={HOST}", f"--grpc-port={self.triton_grpc_port}",
            "--allow-metrics=true", f"--metrics-address={HOST}",
            f"--metrics-port={self.endpoints.metrics_port}",
            "--allow-gpu-metrics=false",
            # Our own drain ends every request by exit_timeout_s; tritonserver's timeout is a backstop.
            f"--exit-timeout-secs={self.exit_timeout_s + DRAIN_MARGIN_S}",
            "--exit-on-error=true", "--strict-readiness=true",
            f"--log-verbose={self.log_verbose}",
            f"--http-restricted-api={ADMIN_APIS}:{ADMIN_KEY_HEADER}={secret(0)}",
            f"--grpc-restricted-protocol={ADMIN_APIS}:{ADMIN_KEY_HEADER}={secret(0)}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if self._front_options is not None:  # the fronts hold the public ports, and the key
            cmd += [f"--http-restricted-api={FRONT_APIS}:{FRONT_KEY_HEADER}={secret(1)}",
                    f"--grpc-restricted-protocol={FRONT_APIS}:{FRONT_KEY_HEADER}={secret(1)}"]
        if not self.auto_complete_config:
            cmd.append("--disable-auto-complete-config")
        return cmd

    @property
    def drain_file(self) -> Path | None:
        return Path(self._workdir.name) / "drain" if self._workdir is not None else None

    def start(self, ready_timeout_s: float = 180.0) -> Endpoints:
        for repo in self.repositories:
            if not repo.is_dir():
                raise UserError(f"model repository not found: {repo}",
                                fix="run `trtbuild deploy RECIPE` first")
        from trtbuild.serve.listener import Limits, raise_fd_limit

        raise_fd_limit()
        end_orphans()
        for port in (self.endpoints.http_port, self.endpoints.grpc_port, self.endpoints.metrics_port):
            if _port_in_use(port):
                raise UserError(f"port {port} on {HOST} is already in use",
                                fix="stop what listens there or choose other ports (deploy.http_port, ...)")
        if self._front_options is not None and self._front is None:
            from trtbuild.serve.front import Front
            from trtbuild.serve.grpc_front import GrpcFront

            limits = Limits.from_fd_limit()  # a relayed gRPC connection costs 3 descriptors, not 2
            self._front = Front(HOST, self.endpoints.http_port, self.triton_http_port,
                                max_body=self._front_options[0], max_depth=self._front_options[1],
                                upstream_headers=self.upstream_headers, limits=limits)
            self._front.upstream_up = False
            self._front.problem = self.problem
            self._front.start()
            self._grpc_front = GrpcFront(HOST, self.endpoints.grpc_port, self.triton_grpc_port,
                                         max_message=self._front_options[0], upstream_metadata=self.upstream_metadata,
                                         limits=Limits(total=limits.total * 2 // 3, per_client=limits.per_client * 2 // 3))
            self._grpc_front.problem = self.problem
            self._grpc_front.start()
        self._launch(ready_timeout_s)
        return self.endpoints

    def _launch(self, ready_timeout_s: float) -> None:
        # tritonserver's own ports were free when picked, but any process (an outgoing connection's
        # ephemeral port included) may take one before tritonserver binds it: pick others and retry.
        for attempt in range(PORT_RETRIES + 1):
            try:
                self._launch_once(ready_timeout_s)
                return
            except BuildError:
                if attempt < PORT_RETRIES and self._lost_a_port_race():
                    self._repick_internal_ports()
                    continue
                self.stop(timeout_s=10)
                raise
            except BaseException:
                self.stop(timeout_s=10)
                raise

    def _lost_a_port_race(self) -> bool:
        if self._front_options is None or self._log_path is None or not self._log_path.is_file():
            return False  # without the fronts the ports are the user's: a clash is theirs to fix
        with open(self._log_path, "rb") as log:
            log.seek(self._log_start)
            return b"already in use" in log.read()  # gRPC: "Address already in use"; HTTP: "Socket '...' already in use"

    def _repick_internal_ports(self) -> None:
        if self._log_file is None and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)  # the next try writes a log of its own
        self.triton_http_port, self.triton_grpc_port = free_port(), free_port()
        if self._auto_metrics_port:  # public, but nobody has been told it yet
            self.endpoints = dataclasses.replace(self.endpoints, metrics_port=free_port())
        if self._front is not None:
            self._front.upstream_port = self.triton_http_port
        if self._grpc_front is not None:
            self._grpc_front.retarget(self.triton_grpc_port)
        self._failed = False

    def _launch_once(self, ready_timeout_s: float) -> None:
        dist = find_dist()
        remove_stale_shm()
        self._workdir = tempfile.TemporaryDirectory(prefix="trtbuild-triton-")
        work = Path(self._workdir.name)
        backend_dir = prepare_backends(dist, work)
        if self._log_file is None:
            # Outside the work dir, so it outlives a failed start; a clean stop removes it.
            fd, name = tempfile.mkstemp(prefix="trtbuild-tritonserver-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        else:
            self._log_path = self._log_file
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
        env = server_env(dist)
        env["TRTBUILD_DRAIN_FILE"] = str(self.drain_file)
        shim = build_shim(work)
        keys = (self._admin_key, self._front_key)
        if shim is not None:
            env.update({f"TRTBUILD_SECRET{n}": key for n, key in enumerate(keys)})
            env["TRTBUILD_PARENT_PID"] = str(os.getpid())
            env["TRTBUILD_LD_PRELOAD_REST"] = env.get("LD_PRELOAD", "")
            env["LD_PRELOAD"] = " ".join(p for p in (str(shim), env.get("LD_PRELOAD")) if p)
            cmd = self.command(backend_dir, dist)
        else:
            self.warnings.append("no C compiler (cc): tritonserver's API key is on its command line and it "
                                 "will not die with `serve`; install gcc to fix both")
            cmd = self.command(backend_dir, dist, secret=lambda n: keys[n])
        self._log_start = self._log_path.stat().st_size if self._log_path.is_file() else 0
        with open(self._log_path, "ab") as log:
            # Own session: the server's process group holds it and its python stubs, so stop()
            # can make sure none of them is left behind. umask 077: its shared memory is its own.
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, cwd=work, start_new_session=True, umask=0o077)
        self.last_pid = self._proc.pid
        write_pid_file(self.endpoints.http_port, self._proc.pid, self.shm_prefix)
        try:
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self._failed = True
            self._stop_server()
            raise
        self.secure_shm()
        if self._front is not None:
            self._front.accepting, self._front.upstream_up = True, True

    def restart(self, ready_timeout_s: float = 180.0) -> None:
        """Start tritonserver again after it died (same ports; the front answers 503 meanwhile)."""
        self._ready = False
        if self._front is not None:
            self._front.upstream_up = False
        self._reap(self._proc)
        self._proc = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        self._launch(ready_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        url = urllib.request.Request(f"http://{self.triton_http}/v2/health/ready", headers=self.upstream_headers)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.secure_shm()
            if self._proc is not None and self._proc.poll() is not None:
                code = self._proc.returncode
                how = f"exited with code {code}" if code >= 0 else f"was {self._how_it_ended()}"
                raise BuildError(f"tritonserver {how} while starting: {self.failure_summary()}",
                                 fix=f"see the log {self._log_path}")
            # Only tritonserver itself gets the probe (and its key): a port another process took
            # before it could bind it makes it exit ("already in use"), and _launch picks others.
            if self._holds_its_ports():
                try:
                    with urllib.request.urlopen(url, timeout=2) as response:
                        if response.status == 200 and self._holds_its_ports():
                            self._ready = True
                            return
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    pass
            time.sleep(0.2)
        raise BuildError(f"tritonserver not ready after {timeout_s:.0f} s: {self.failure_summary()}",
                         fix=f"see the log {self._log_path}")

    def secure_shm(self) -> None:
        """The python backend creates its regions mode 0644 whatever the umask (boost fchmods them):
        make them private to this user as soon as they appear, before any prompt passes through.
        Out of file descriptors (EMFILE), the scan waits for the next round."""
        with contextlib.suppress(OSError):
            for region in shm_regions(self.shm_prefix):
                with contextlib.suppress(OSError):
                    if region.stat().st_mode & 0o077:
                        region.chmod(0o600)

    def death_reason(self) -> str:
        """Why the process ended: the signal or exit code first (a crash logs nothing telling), then
        the most telling log line."""
        return f"{self._how_it_ended()}; log: {self.failure_summary()}"

    def _how_it_ended(self) -> str:
        code = self._proc.poll() if self._proc is not None else None
        if code is None:
            return "still running"
        if code >= 0:
            return f"exit code {code}"
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"

    def failure_summary(self) -> str:
        """The most telling log line, for one-line messages: why a model failed to load, else the
        first error line that is not one of the CPU-only start-up notices."""
        lines = self.log_text().splitlines()
        glog_errors = [line for line in lines if re.match(r"E\d{4} ", line)]  # E1202 12:00:00.000 ...
        failed = [line for line in glog_errors if "failed to load" in line]
        telling = [line for line in glog_errors if not any(n in line for n in _BENIGN)]
        # Other lines naming an error, except the start-up options table (`| exit_on_error | 1 |`).
        others = [line for line in lines if "error" in line.lower() and "|" not in line]
        picked = (failed or telling or others or lines[-1:] or ["no output"])[0]
        picked = re.sub(r"^[EIW]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ", "", picked)  # the glog prefix
        picked = picked.split("\\n")[0].strip().strip('"')  # the message, without the traceback
        return picked[:400]

    def log_text(self) -> str:
        if self._log_path is None or not self._log_path.is_file():
            return ""
        return self._log_path.read_text(errors="replace")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _holds_its_ports(self) -> bool:
        proc = self._proc
        return proc is not None and holds_ports(proc.pid, (self.triton_http_port, self.triton_grpc_port))

    def problem(self) -> str | None:
        """Why the model cannot answer now: tritonserver is not running or not yet ready on ports it
        holds (checked on every call: the fronts ask before each request, so none goes to a dead
        server's port, which anyone may have taken), or a process of its group stopped (SIGSTOP, a
        debugger; read from /proc at most every 0.5 s: its readiness does not see it)."""
        if not self._ready or not self.is_running():
            return "the server is restarting; try again shortly"
        checked, found = self._problem
        if time.monotonic() - checked < 0.5:
            return found
        found = None
        pgid = self.pid
        if pgid is not None:
            for member in group_members(pgid):
                with contextlib.suppress(OSError, IndexError):
                    state = (Path("/proc") / str(member) / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state in ("T", "t"):
                        found = f"the model process {member} is stopped; requests cannot be answered"
                        break
        self._problem = (time.monotonic(), found)
        return found

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _stop_server(self) -> None:
        """End a tritonserver that failed to start (the fronts stay up for the next try)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            self._reap(proc)
            remove_pid_file(self.endpoints.http_port, proc.pid)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Graceful stop: refuse new requests, let those in flight finish for `timeout_s` (default
        exit_timeout_s), then cut them (the drain file) and wait for tritonserver to unload and exit;
        kill what is left and remove its shared-memory regions."""
        if self._front is not None:
            self._front.accepting = False
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            drain_s = timeout_s if timeout_s is not None else self.exit_timeout_s
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=drain_s)
            except subprocess.TimeoutExpired:
                if self.drain_file is not None:
                    self.drain_file.touch()  # the model cuts what still runs, then tritonserver exits
                try:
                    code = proc.wait(timeout=DRAIN_MARGIN_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait()
            self._reap(proc)
            remove_pid_file(self.endpoints.http_port, proc.pid)
        if self._front is not None:
            self._front.close()
            self._front = None
        if self._grpc_front is not None:
            self._grpc_front.close()
            self._grpc_front = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        if (self._log_file is None and self._log_path is not None and code == 0 and not self._failed
                and self._log_path.is_file()):
            self._log_path.unlink()
        return code

    def _reap(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None:
            _kill_group(proc.pid)
        remove_shm(self.shm_prefix)

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shm_regions(prefix: str) -> list[Path]:
    shm = Path("/dev/shm")
    return sorted(shm.glob(f"{prefix}*")) if prefix and shm.is_dir() else []


def remove_stale_shm() -> list[Path]:
    """Regions of trtbuild servers that were SIGKILLed (nothing could clean up after them): ours by
    name and owner, and neither open nor mapped by any process. Removed at each start."""
    regions = [r for r in shm_regions("trtbuild_") if _owned(r)]
    if not regions:
        return []
    in_use: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            in_use.update(os.readlink(fd) for fd in (proc / "fd").iterdir())
        with contextlib.suppress(OSError):
            in_use.update(line.split(maxsplit=5)[-1] for line in (proc / "maps").read_text().splitlines()
                          if "/dev/shm/" in line)
    stale = [r for r in regions if str(r) not in in_use]
    for region in stale:
        with contextlib.suppress(OSError):
            region.unlink()
    return stale


def _owned(path: Path) -> bool:
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False


def remove_shm(prefix: str) -> None:
    """Remove the python backend's regions of one server (left behind when it was killed)."""
    for region in shm_regions(prefix):
        with contextlib.suppress(OSError):
            region.unlink()


def build_shim(where: Path) -> Path | None:
    """Compile native/argv_secrets.c into `where` (tritonserver's private work dir); None without cc."""
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not SHIM_SOURCE.is_file():
        return None
    out = where / f"argv_secrets_{hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:12]}.so"
    result = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE)],
                            capture_output=True, timeout=120, check=False)
    return out if result.returncode == 0 and out.is_file() else None


# -- what a SIGKILLed `serve` leaves: a pid file per HTTP port ----------------------------------

def pid_dir() -> Path:
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    return base / f"trtbuild-serve-{os.getuid()}"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): tells a pid from a reused one."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def write_pid_file(http_port: int, triton_pid: int, shm_prefix: str) -> None:
    directory = pid_dir()
    with contextlib.suppress(OSError):
        directory.mkdir(mode=0o700, exist_ok=True)
        if directory.is_symlink() or directory.stat().st_uid != os.getuid():
            return
        record = {"supervisor": os.getpid(), "supervisor_start": _start_time(os.getpid()),
                  "tritonserver": triton_pid, "tritonserver_start": _start_time(triton_pid),
                  "shm_prefix": shm_prefix}
        tmp = directory / f".serve-{http_port}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(directory / f"serve-{http_port}.json")


def remove_pid_file(http_port: int, triton_pid: int) -> None:
    path = pid_dir() / f"serve-{http_port}.json"
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("tritonserver") == triton_pid:
            path.unlink()


def _ours(pid: int) -> bool:
    """A process of this user that is tritonserver or one of its python-backend stubs."""
    try:
        if (Path("/proc") / str(pid)).stat().st_uid != os.getuid():
            return False
        cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return b"tritonserver" in cmdline or b"triton_python_backend_stub" in cmdline


def end_orphans() -> list[int]:
    """End the tritonserver process groups of `serve`s that are gone (SIGKILL, OOM killer) and
    remove their shared memory; returns the pids ended. Pid files of live supervisors are kept."""
    directory = pid_dir()
    ended: list[int] = []
    if not directory.is_dir() or directory.is_symlink():
        return ended
    for path in directory.glob("serve-*.json"):
        try:
            record = json.loads(path.read_text())
            supervisor, pgid = int(record["supervisor"]), int(record["tritonserver"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _start_time(supervisor) is not None and _start_time(supervisor) == record.get("supervisor_start"):
            continue  # that serve still runs
        members = [pid for pid in group_members(pgid) if _ours(pid)]
        if members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            ended += members
        prefix = str(record.get("shm_prefix", ""))
        if prefix.startswith("trtbuild_"):
            remove_shm(prefix)
        with contextlib.suppress(OSError):
            path.unlink()
    return ended


def group_members(pgid: int) -> list[int]:
    """Live processes in a process group (read from /proc; zombies excluded)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _kill_group(pgid: int, grace_s: float = 5.0) -> None:
    """Stubs exit on their own once the server is gone; give them a moment, then kill the rest."""
    deadline = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_members(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0


def serve(repositories: Sequence[Path], *, http_port: int = 8000, grpc_port: int = 8001,
          metrics_port: int = 8002, models: Sequence[str] = (), exit_timeout_s: int = 30,
          log_file: Path | None = None, echo: Callable[[str], None] = print, ready_timeout_s: float = 300.0,
          stop_event: threading.Event | None = None,
          attach: Callable[[TritonServer], contextlib.AbstractContextManager[list[str]]] | None = None) -> int:
    """`trtbuild serve`: start, print the endpoints, block until SIGINT/SIGTERM, stop gracefully.

    A tritonserver that dies is started again on the same ports (the front answers 503 meanwhile),
    with the reason printed: the signal or exit code and the log's telling line; more than
    MAX_RESTARTS deaths within RESTART_WINDOW_S end `serve` with that reason. Returns tritonserver's
    exit code (0 after a clean shutdown). `stop_event` lets a caller (or a test) ask for the same
    shutdown without a signal. `attach` starts a front end (the OpenAI API) once the server is ready
    (its lines are printed) and is closed before the server drains.
    """
    stop = stop_event or threading.Event()
    server = TritonServer(repositories, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                          exit_timeout_s=exit_timeout_s, log_file=log_file)
    previous = {}
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    deaths: list[float] = []
    try:
        endpoints = server.start(ready_timeout_s=ready_timeout_s)
        echo(f"tritonserver ready (pid {server.pid}); Ctrl-C stops it")
        for line in endpoints.lines(models):
            echo("  " + line)
        with attach(server) if attach else contextlib.nullcontext([]) as attached:
            for line in attached:
                echo("  " + line)
            for line in server.warnings:
                echo("  warning: " + line)
            while not stop.wait(0.5):
                if server.is_running():
                    server.secure_shm()  # regions made later (a new instance) become private too
                    continue
                try:
                    reason = server.death_reason()
                except OSError as exc:  # out of file descriptors: the log cannot be read just now
                    reason = f"{server._how_it_ended()}; log unreadable ({exc.strerror})"
                now = time.monotonic()
                deaths = [t for t in deaths if now - t < RESTART_WINDOW_S] + [now]
                if len(deaths) > MAX_RESTARTS:
                    raise BuildError(f"tritonserver died {len(deaths)} times in {RESTART_WINDOW_S:.0f} s; "
                                     f"the last time: {reason}", fix=f"see the log {server._log_path}")
                echo(f"tritonserver died ({reason}); restarting ({len(deaths)}/{MAX_RESTARTS})")
                server.restart(ready_timeout_s=ready_timeout_s)
                echo(f"tritonserver ready again (pid {server.pid})")
        echo("stopping: draining in-flight requests ...")
        code = server.stop()
        echo(f"tritonserver stopped (exit code {code})")
        return code or 0
    finally:
        server.stop(timeout_s=10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trtbuild.serve.server REPO [REPO ...]`: serve model repositories on 127.0.0.1."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trtbuild.serve.server", description=main.__doc__)
    parser.add_argument("repositories", nargs="+", type=Path)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--exit-timeout", type=int, default=30, help="seconds in-flight requests may take")
    parser.add_argument("--log-file", type=Path, default=None)
    args = parser.parse_args(argv)
    models = sorted(p.parent.name for repo in args.repositories for p in repo.glob("*/config.pbtxt"))
    try:
        return serve(args.repositories, http_port=args.http_port, grpc_port=args.grpc_port,
                     metrics_port=args.metrics_port, models=models, exit_timeout_s=args.exit_timeout,
                     log_file=args.log_file)
    except TrtbuildError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
