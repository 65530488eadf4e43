"""Issue 38 finding 5: a rendezvous port held by a program that is not torch (inside a Slurm
allocation) made the build print nothing and hang until killed. Now the first node's port is checked
before the launch (one line naming draft.train.slurm.rdzv_port), and ranks that do not start within
the rendezvous time end the launch with one line. Real torchrun, real listeners."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from trtbuild.core.errors import BuildError
from trtbuild.core.progress import Progress
from trtbuild.draft import distributed, rendezvous


def _squatter(answering: bool) -> socket.socket:
    """A plain program on a port of all interfaces: silent (never accepts) or answering garbage."""
    sock = socket.socket()
    sock.bind(("", 0))
    sock.listen(16)
    if answering:
        def serve() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno")
        threading.Thread(target=serve, daemon=True).start()
    return sock


def test_a_held_rendezvous_port_on_this_node_is_found_before_the_launch() -> None:
    with _squatter(answering=False) as held:
        port = held.getsockname()[1]
        for head in (socket.gethostname(), "localhost"):
            problem = rendezvous.port_problem(head, port)
            assert problem is not None and str(port) in problem and "another program" in problem, (head, problem)
    assert rendezvous.port_problem(socket.gethostname(), port) is None  # free again
    assert not rendezvous.is_this_host("no-such-node-38.invalid")


@pytest.mark.parametrize("answering", [False, True])
def test_ranks_that_never_meet_end_the_launch_with_one_line(tmp_path: Path, answering: bool) -> None:
    """torchrun for node 1 of 2 meeting at a port another program holds: it waits silently for ever
    (checked for 100 s by hand); launch gives up after the rendezvous time with one line."""
    with _squatter(answering) as held:
        meeting = f"127.0.0.1:{held.getsockname()[1]}"
        argv = distributed.torchrun_argv(tmp_path / "job.json", 1, 2, meeting)
        started = time.monotonic()
        with pytest.raises(BuildError) as caught:
            distributed.launch(argv, tmp_path, 1, Progress(), "draft: training", rendezvous_s=15, meeting=meeting)
        took = time.monotonic() - started
    message = caught.value.one_line()
    assert len(message.splitlines()) == 1 and meeting in message and "rdzv_port" in message, message
    assert took < 15 + 30, took
