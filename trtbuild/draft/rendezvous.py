"""The multi-node training's meeting point: torchrun's c10d rendezvous on the allocation's first node.

torchrun on the first node serves the rendezvous store on `draft.train.slurm.rdzv_port`; when
another program listens there, torchrun talks to that program instead and waits, silently, for ever.
`port_problem` finds that before the launch (on the first node, where the build runs under sbatch);
`RENDEZVOUS_TIMEOUT_S` bounds the wait for the ranks to start anywhere else (distributed.launch).
"""

from __future__ import annotations

import contextlib
import errno
import socket

RENDEZVOUS_TIMEOUT_S = 600.0  # torchrun's own join_timeout: the nodes have this long to meet


def is_this_host(host: str) -> bool:
    """True when `host` names this machine (its hostname, short or full, or one of its addresses)."""
    names = {socket.gethostname(), socket.getfqdn(), "localhost"}
    if host in names or host.split(".")[0] in {n.split(".")[0] for n in names}:
        return True
    with contextlib.suppress(OSError):
        address = socket.gethostbyname(host)
        if address.startswith("127."):
            return True
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))  # only an address of this machine can be bound
            return True
    return False


def port_problem(head: str, port: int) -> str | None:
    """Why torchrun cannot serve the rendezvous on `head`:`port`, when `head` is this machine and
    another program listens there; else None (another machine's port cannot be checked from here)."""
    if not is_this_host(head):
        return None
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None
            return (f"port {port} on {head}, where the nodes meet (torchrun's rendezvous), is held by another "
                    "program; torchrun would wait on it for ever")
    return None
