"""Free TCP ports on this machine, for the servers xdiag starts itself (the local stack, the viewer)."""

from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports of `host`. Every socket stays bound until all are chosen: a port chosen and
    released at once can be chosen again by the next call, and two servers then meet on one port (the local stack's
    Pub/Sub emulator once pushed register's messages to investigate)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
