"""Issue 38 finding 1 (the fast part): serve asks whose listener is on tritonserver's ports before it
sends anything there (trtbuild/triton/ownership.py); the slow end-to-end case with a real tritonserver
and a squatter is tests/test_serve_reliability.py::test_after_a_restart_every_front_talks_to_its_own_tritonserver_only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from trtbuild.serve.ownership import holds_ports, listening_inodes


def test_a_port_is_held_only_by_the_process_that_listens_there() -> None:
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen(1)
        port = mine.getsockname()[1]
        assert listening_inodes(port)
        assert holds_ports(os.getpid(), [port])
    assert not holds_ports(os.getpid(), [port])  # nobody listens: not held

    squatter = subprocess.Popen([sys.executable, "-c", "import socket, sys; s = socket.socket(); "
                                 "s.bind(('127.0.0.1', 0)); s.listen(1); print(s.getsockname()[1], flush=True); "
                                 "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = int(squatter.stdout.readline())
        assert holds_ports(squatter.pid, [theirs])
        assert not holds_ports(os.getpid(), [theirs])  # another process's listener is not ours
        with socket.socket() as mine:
            mine.bind(("127.0.0.1", 0))
            mine.listen(1)
            assert not holds_ports(os.getpid(), [mine.getsockname()[1], theirs])  # every port must be held
    finally:
        squatter.stdin.close()
        squatter.wait(timeout=10)


def test_a_second_listener_on_the_same_port_is_seen() -> None:
    """SO_REUSEPORT lets a process of the same user listen beside ours: then the port is not ours alone."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return
    with socket.socket() as mine:
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        mine.bind(("127.0.0.1", 0))
        mine.listen(1)
        port = mine.getsockname()[1]
        beside = subprocess.Popen([sys.executable, "-c", "import socket, sys; s = socket.socket(); "
                                   "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); "
                                   f"s.bind(('127.0.0.1', {port})); s.listen(1); print('up', flush=True); "
                                   "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert beside.stdout.readline().strip() == "up"
            assert len(listening_inodes(port) or ()) == 2
            assert not holds_ports(os.getpid(), [port])
        finally:
            beside.stdin.close()
            beside.wait(timeout=10)
        assert holds_ports(os.getpid(), [port])
