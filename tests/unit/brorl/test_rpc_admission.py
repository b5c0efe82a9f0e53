"""Admission control of brorl.rpc.Server: beyond ``max_concurrent_rpcs`` calls in flight (an open
stream counts until it ends) gRPC answers RESOURCE_EXHAUSTED at once instead of queueing, and
the server takes calls again as soon as slots free up."""

from __future__ import annotations

import threading

import grpc
import pytest

from brorl import rpc
from brorl.config.base import validate
from services.learner.config import LearnerServiceConfig
from services.reward.config import RewardServiceConfig
from services.reward.server import build_server
from services.rollout.config import RolloutServiceConfig

SERVICE = "test.Blocking"


@pytest.fixture
def blocking_server():
    """A Server with 2 slots whose Hold / HoldStream calls wait until ``release`` is set."""
    release = threading.Event()
    entered = threading.Semaphore(0)

    def hold(request, context):
        entered.release()
        release.wait(10)
        return b"done"

    def hold_stream(request, context):
        entered.release()
        yield b"first"
        release.wait(10)
        yield b"last"

    server = rpc.Server("127.0.0.1:0", [SERVICE], max_workers=4, max_concurrent_rpcs=2)
    server.grpc.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Hold": grpc.unary_unary_rpc_method_handler(hold),
                    "HoldStream": grpc.unary_stream_rpc_method_handler(hold_stream),
                },
            )
        ]
    )
    server.start().set_serving(True)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield channel, release, entered
    finally:
        release.set()
        channel.close()
        server.stop(0)


def _call(channel, method: str):
    return channel.unary_unary(f"/{SERVICE}/{method}")


def test_calls_beyond_the_limit_are_resource_exhausted_at_once(blocking_server):
    channel, release, entered = blocking_server
    hold = _call(channel, "Hold")
    in_flight = [hold.future(b"", timeout=20) for _ in range(2)]
    for _ in in_flight:
        assert entered.acquire(timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        hold(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    release.set()
    assert [f.result() for f in in_flight] == [b"done", b"done"]
    assert hold(b"", timeout=5) == b"done"  # slots are given back


def test_an_open_stream_holds_a_slot_until_it_ends(blocking_server):
    channel, release, entered = blocking_server
    streams = [channel.unary_stream(f"/{SERVICE}/HoldStream")(b"", timeout=20) for _ in range(2)]
    assert [next(s) for s in streams] == [b"first", b"first"]
    with pytest.raises(grpc.RpcError) as err:
        _call(channel, "Hold")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    release.set()
    assert [list(s) for s in streams] == [[b"last"], [b"last"]]
    assert _call(channel, "Hold")(b"", timeout=5) == b"done"


def test_every_service_has_its_own_limit():
    assert validate(RewardServiceConfig, {}).max_concurrent_rpcs == 64
    assert validate(RolloutServiceConfig, {"model": "m"}).max_concurrent_rpcs == 64
    assert validate(LearnerServiceConfig, {}).max_concurrent_rpcs == 32
    server = build_server(
        validate(RewardServiceConfig, {"bind": "127.0.0.1:0", "max_concurrent_rpcs": 3})
    )
    try:
        assert server.max_concurrent_rpcs == 3
    finally:
        server.stop(0)
    with pytest.raises(ValueError):
        rpc.Server("127.0.0.1:0", [SERVICE], max_concurrent_rpcs=0)
