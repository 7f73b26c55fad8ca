"""Free TCP ports on this machine, for the servers xdiag starts itself (the local stack, the viewer)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_BELOW_EPHEMERAL = 10_000
"""How many ports under the kernel's ephemeral range the servers' ports are drawn from."""


def _ports_to_try() -> list[int]:
    """Ports under the ephemeral range, shuffled: the kernel gives a port of that range to every outgoing connection
    (of any process), so a port chosen there and bound seconds later, once its server has started, may be taken by
    then (the local stack's storage emulator once met `address already in use` so). Empty where the range is not
    known or starts too low; then the kernel chooses (bind to port 0)."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    if low - _BELOW_EPHEMERAL < 1024:
        return []
    ports = list(range(low - _BELOW_EPHEMERAL, low))
    random.shuffle(ports)
    return ports


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports of `host`, outside the ephemeral range where it is known. Every socket stays bound
    until all are chosen: a port chosen and released at once can be chosen again by the next call, and two servers
    then meet on one port (the local stack's Pub/Sub emulator once pushed register's messages to investigate)."""
    sockets: list[socket.socket] = []
    candidates = iter(_ports_to_try())
    try:
        while len(sockets) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            for port in candidates:
                try:
                    s.bind((host, port))
                    break
                except OSError:
                    continue
            else:
                s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
