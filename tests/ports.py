"""Free loopback ports for tests that start servers of their own.

The ports come from below the kernel's ephemeral range (``ip_local_port_range``, 32768-60999 by
default). A port inside it, free when the test looks, can be taken a moment later as the local
end of any outbound connection on the machine (a Redis or gRPC client of the suite's other lane),
and the server that the test then starts fails with "Address already in use": a sweep on the
fixed --base-port 50560 failed so in CI. Below the range only listeners take ports, and a random
pick makes two lanes' picks meet rarely.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Callable

LOWEST = 10_000  # below it sit well-known services' ports
# a --base-port's block (brorl.cluster.ClusterLayout): reward, learner, env, six workers at +10
BASE_PORT_SPAN = 16


def _below_ephemeral() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(ports: list[int]) -> bool:
    socks = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def _first_bindable(draw: Callable[[], list[int]], what: str) -> list[int]:
    for _ in range(200):
        if _bindable(ports := draw()):
            return ports
    raise RuntimeError(f"no {what} free below the ephemeral range")


def free_port_block(span: int = BASE_PORT_SPAN) -> int:
    """A port ``p`` with ``p .. p + span - 1`` all free right now, below the ephemeral range
    (for a command's ``--base-port``: reward p, learner p + 1, rollout worker i p + 10 + i)."""
    top = _below_ephemeral() - span
    if top <= LOWEST:
        raise RuntimeError(f"the ephemeral port range starts below {LOWEST + span}")

    def block() -> list[int]:
        base = random.randrange(LOWEST, top)
        return list(range(base, base + span))

    return _first_bindable(block, f"{span} ports in a row")[0]


def free_ports(k: int) -> list[int]:
    """``k`` distinct ports free right now, below the ephemeral range."""
    top = _below_ephemeral()
    return _first_bindable(lambda: random.sample(range(LOWEST, top), k), f"{k} ports")
