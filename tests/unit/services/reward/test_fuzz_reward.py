"""Fuzzed requests to every RewardService RPC, served in this process over a real loopback port:
at least 500 random and boundary-valued requests each; every answer is OK or a status of the
table below (docs/reliability.md), never INTERNAL/UNKNOWN, and health says SERVING after."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import strategies as st
from hypothesis import given

from brorl import rpc
from brorl.config.base import validate
from brorl.v1 import reward_pb2, reward_pb2_grpc
from services.reward.config import BUILTIN_FUNCTIONS, RewardServiceConfig
from services.reward.server import SERVICE_NAME, build_server
from tests import fuzz_rpc as f

pytestmark = pytest.mark.slow

OK, INVALID, EXHAUSTED = (
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)
# The documented answers of each RPC. A reward function that fails on an item is not an RPC
# error: that item comes back with status "error" / "timeout".
ALLOWED = {
    "Score": {OK, INVALID},  # INVALID_ARGUMENT: empty or unknown reward_fn, bad composite
    "ScoreBatch": {OK, INVALID, EXHAUSTED},  # RESOURCE_EXHAUSTED: more items than max_batch
    "ListRewardFunctions": {OK},
}
MAX_BATCH = 8

reward_fns = st.one_of(
    st.sampled_from(sorted(BUILTIN_FUNCTIONS)),
    st.sampled_from(["composite:exact_match=0.5,format=0.5", "composite:safety=1e30"]),
    f.text(40),
)


def score_requests():
    return st.builds(
        reward_pb2.ScoreRequest,
        reward_fn=reward_fns,
        prompt=f.text(),
        completion=f.text(),
        reference=f.text(),
        id=f.text(40),
    )


@pytest.fixture(scope="module")
def reward():
    cfg = validate(RewardServiceConfig, {"bind": "127.0.0.1:0", "max_batch": MAX_BATCH})
    server = build_server(cfg).start()
    server.set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")  # the message limits of brorl clients
    try:
        yield channel, reward_pb2_grpc.RewardServiceStub(channel), f.Tally(ALLOWED)
    finally:
        channel.close()
        server.stop(0)


def test_the_table_covers_every_reward_rpc():
    methods = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].methods_by_name
    assert set(ALLOWED) == set(methods)


def test_fuzz_score(reward):
    channel, stub, tally = reward

    @f.FUZZ
    @given(score_requests())
    def run(request):
        tally.call("Score", lambda: stub.Score(request, timeout=30))

    run()
    tally.assert_enough("Score")
    f.assert_serving(channel, SERVICE_NAME)


def test_fuzz_score_batch(reward):
    channel, stub, tally = reward

    @f.FUZZ
    @given(reward_fns, st.lists(score_requests(), max_size=MAX_BATCH + 2))
    def run(reward_fn, items):
        request = reward_pb2.ScoreBatchRequest(reward_fn=reward_fn, items=items)
        code = tally.call("ScoreBatch", lambda: stub.ScoreBatch(request, timeout=60))
        assert (code == EXHAUSTED) == (len(items) > MAX_BATCH) or code == INVALID

    run()
    tally.assert_enough("ScoreBatch")
    assert tally.seen["ScoreBatch"]["OK"] > 0
    f.assert_serving(channel, SERVICE_NAME)


def test_fuzz_list_reward_functions(reward):
    channel, _, tally = reward
    call = f.raw_unary(channel, f"/{SERVICE_NAME}/ListRewardFunctions")

    @f.FUZZ
    @given(f.unknown_fields())
    def run(body):
        tally.call("ListRewardFunctions", lambda: call(body, timeout=10))

    run()
    tally.assert_enough("ListRewardFunctions")
    f.assert_serving(channel, SERVICE_NAME)
