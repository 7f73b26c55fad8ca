"""The ports the local stack and the viewer start their servers on: free, distinct, and under the kernel's ephemeral
range, which outgoing connections draw from while the servers start."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from xdiag.local_ports import free_ports

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_the_ports_are_distinct_free_and_outside_the_ephemeral_range():
    ports = free_ports(20)
    assert len(set(ports)) == 20
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free: nothing kept it
    if not RANGE.exists():
        pytest.skip("no /proc ephemeral range here: the kernel chose the ports")
    low, high = map(int, RANGE.read_text().split())
    if low < 11_024:
        pytest.skip(f"the ephemeral range starts at {low}: too low to draw ports under it, the kernel chose them")
    assert all(not low <= port <= high for port in ports), (ports, low, high)
