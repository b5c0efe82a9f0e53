"""The environment service (envs/server.py) over a real loopback port: Reset/Step/Close/Describe,
a retried step answered again without being applied twice, steps out of order refused, bad ids
INVALID_ARGUMENT, unknown episodes NOT_FOUND, and the episode table's bounds."""

from __future__ import annotations

import time

import grpc
import pytest

from brorl import rpc
from brorl.config.base import validate
from brorl.errors import ResourceExhausted
from brorl.v1 import environment_pb2 as pb
from brorl.v1 import environment_pb2_grpc
from envs.calculator import Calculator
from envs.config import EnvServiceConfig
from envs.episodes import EpisodeTable
from envs.server import build_server


@pytest.fixture
def stub():
    cfg = validate(EnvServiceConfig, {"env": "calculator", "bind": "127.0.0.1:0"})
    server = build_server(cfg).start()
    server.set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")
    try:
        yield environment_pb2_grpc.EnvironmentServiceStub(channel)
    finally:
        channel.close()
        server.stop(0)


def test_an_episode_over_grpc(stub):
    about = stub.Describe(pb.DescribeRequest(), timeout=5)
    assert (about.name, about.max_turns) == ("calculator", 4)
    stub.Reset(pb.ResetRequest(episode_id="j/0", prompt="6*7=", reference="42"), timeout=5)
    call = stub.Step(pb.StepRequest(episode_id="j/0", turn=1, action_text="[6*7]"), timeout=5)
    assert (call.observation.text, call.done) == ("42|", False)
    again = stub.Step(pb.StepRequest(episode_id="j/0", turn=1, action_text="[1+1]"), timeout=5)
    assert again == call  # the retry is answered as the first try was; nothing applied twice
    final = stub.Step(
        pb.StepRequest(episode_id="j/0", turn=2, action_text="42", policy_done=True), timeout=5
    )
    assert (final.reward, final.done) == (1.0, True)
    stub.Close(pb.CloseRequest(episode_id="j/0"), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        stub.Step(pb.StepRequest(episode_id="j/0", turn=3, action_text="x"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_steps_out_of_order_and_bad_ids_are_refused(stub):
    stub.Reset(pb.ResetRequest(episode_id="j/1", prompt="1+1=", reference="2"), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        stub.Step(pb.StepRequest(episode_id="j/1", turn=2, action_text="[1+1]"), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    for request in (pb.StepRequest(episode_id="", turn=1), pb.StepRequest(episode_id="j/1")):
        with pytest.raises(grpc.RpcError) as err:
            stub.Step(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_table_is_bounded_and_forgets_abandoned_episodes():
    # the ttl outlasts a loaded machine's pause between the resets below
    table = EpisodeTable(Calculator(), capacity=2, ttl_s=1.0)
    table.reset("a", "1+1=", "2", {}, 0)
    table.reset("b", "1+1=", "2", {}, 0)
    table.reset("a", "1+1=", "2", {}, 0)  # a retried Reset is not a new episode
    with pytest.raises(ResourceExhausted):
        table.reset("c", "1+1=", "2", {}, 0)
    time.sleep(1.1)
    table.reset("c", "1+1=", "2", {}, 0)  # a and b expired
    assert len(table) == 1
