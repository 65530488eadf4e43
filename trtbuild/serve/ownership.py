"""Whose listener is on a port: serve talks to tritonserver's own ports only while tritonserver
itself holds them, so a process that took a port after tritonserver died (or before it bound it)
never gets a request, nor the key the fronts send with each.

Linux: the port's listening sockets come from /proc/net/tcp{,6} (their inodes), and a process holds
one when /proc/<pid>/fd has a link to `socket:[inode]`. The same user's processes are all visible.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[int] | None:
    """The inodes of every socket listening on `port` (any address), or None when /proc/net/tcp
    cannot be read (not Linux)."""
    found: set[int] = set()
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                found.add(int(fields[9]))
    return found if readable else None


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """The inodes of the sockets process `pid` has open (empty when it is gone)."""
    inodes: set[int] = set()
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def holds_ports(pid: int, ports: Iterable[int]) -> bool:
    """True when process `pid` holds every listener on each of `ports` (and each has one): no
    other process listens there beside it (SO_REUSEPORT) or instead of it. Where /proc cannot tell
    (not Linux), True."""
    mine: set[int] | None = None
    for port in ports:
        listening = listening_inodes(port)
        if listening is None:
            return True
        if not listening:
            return False
        if mine is None:
            mine = socket_inodes(pid)
        if not listening <= mine:
            return False
    return True
