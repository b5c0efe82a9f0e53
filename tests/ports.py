"""Free loopback ports for tests that start servers of their own."""

from __future__ import annotations

import socket


def free_ports(k: int) -> list[int]:
    """``k`` distinct ports free right now (all bound at once, so none repeats)."""
    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
