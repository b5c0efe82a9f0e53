"""The suite's free-port helpers (tests/ports.py) pick ports the kernel never hands out to an
outbound connection, so a server started on them a moment later can bind."""

import socket

from tests.ports import _below_ephemeral, free_port_block, free_ports


def test_a_port_block_lies_below_the_ephemeral_range_and_binds_whole():
    for _ in range(20):
        base = free_port_block(16)
        assert 10_000 <= base and base + 16 <= _below_ephemeral()
        socks = [socket.socket() for _ in range(16)]
        try:
            for i, s in enumerate(socks):
                s.bind(("127.0.0.1", base + i))
        finally:
            for s in socks:
                s.close()


def test_free_ports_are_distinct_below_the_ephemeral_range_and_skip_a_held_one():
    held = socket.socket()
    held.bind(("127.0.0.1", free_ports(1)[0]))
    try:
        for _ in range(20):
            ports = free_ports(5)
            assert len(set(ports)) == 5
            assert all(10_000 <= p < _below_ephemeral() for p in ports)
            assert held.getsockname()[1] not in ports
    finally:
        held.close()
