"""Fuzzed requests to every RolloutService RPC, served in this process over a real loopback port
with a stand-in engine (the real vLLM engine's pass is tests/e2e/test_fuzz_rollout_engine.py):
at least 500 random and boundary-valued requests each; every answer is OK or a status of the
table below (docs/reliability.md), never INTERNAL/UNKNOWN, and health says SERVING after."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import grpc
import pytest
from hypothesis import strategies as st
from hypothesis import given

from brorl import rpc
from brorl.config.base import validate
from brorl.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from services.rollout.config import RolloutServiceConfig
from services.rollout.server import SERVICE_NAME, RolloutServicer
from services.rollout.worker import WorkerStats
from tests import fuzz_rpc as f

pytestmark = pytest.mark.slow

OK, INVALID = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
# The documented answers of each RPC (UNAVAILABLE only while the engine loads, which this test
# does not cover; RESOURCE_EXHAUSTED only beyond max_concurrent_rpcs: tests/unit/brorl/
# test_rpc_admission.py).
ALLOWED = {
    "Generate": {OK, INVALID},  # INVALID_ARGUMENT: empty prompt, sampling out of range
    "GenerateStream": {OK, INVALID},
    "GetStatus": {OK},
}
MAX_N = 64


class FakeEngine:
    """RolloutEngine's interface without vLLM; raises ValueError where vLLM's own validation
    does (a prompt longer than the context), which the servicer must turn into
    INVALID_ARGUMENT."""

    weight_version = 3
    max_model_len = 64

    def generate(self, prompts, n, temperature, top_k, top_p, max_tokens, seed, stop):
        [prompt] = prompts
        prompt_ids = list(prompt.encode()[: self.max_model_len + 1])
        if len(prompt_ids) > self.max_model_len:
            raise ValueError(f"prompt is longer than max_model_len={self.max_model_len}")
        sample = SimpleNamespace(
            token_ids=[1, 2], logprobs=[-0.5, -1.5], text="ab", finish_reason="length"
        )
        return [(prompt_ids, [sample] * n)]


def sampling_params():
    """Half within the documented ranges (so the engine is reached), half anything a proto can
    carry (so the checks are)."""
    anything = st.builds(
        common_pb2.SamplingParams,
        n=f.int32(edges=(MAX_N, MAX_N + 1)),
        temperature=f.float32(),
        top_k=f.int32(),
        top_p=f.float32(edges=(0.5, 1.0000001)),
        max_tokens=f.int32(),
        seed=f.int64(),
        stop=st.lists(f.text(20), max_size=4),
    )
    plausible = st.builds(
        common_pb2.SamplingParams,
        n=st.integers(1, MAX_N),
        temperature=st.floats(0.0625, 2.0, width=32),
        top_k=st.integers(-1, 100),
        top_p=st.floats(0.0, 1.0, width=32),
        max_tokens=st.one_of(st.integers(0, 32), f.int32(0)),
        seed=f.int64(),
        stop=st.lists(st.text(max_size=4), max_size=3),
    )
    return st.one_of(plausible, anything)


def generate_requests():
    return st.builds(
        rollout_pb2.GenerateRequest,
        prompt=f.text(),
        sampling=sampling_params(),
        prompt_id=f.text(40),
    )


@pytest.fixture(scope="module")
def rollout():
    cfg = validate(RolloutServiceConfig, {"model": "fake", "max_n": MAX_N, "worker_loop": False})
    servicer = RolloutServicer(FakeEngine(), threading.Lock(), cfg, WorkerStats())
    server = rpc.Server("127.0.0.1:0", [SERVICE_NAME])
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server.grpc)
    server.start().set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")  # the message limits of brorl clients
    try:
        yield channel, rollout_pb2_grpc.RolloutServiceStub(channel), f.Tally(ALLOWED)
    finally:
        channel.close()
        server.stop(0)


def test_the_table_covers_every_rollout_rpc():
    methods = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].methods_by_name
    assert set(ALLOWED) == set(methods)


@pytest.mark.parametrize("method", ["Generate", "GenerateStream"])
def test_fuzz_generate(rollout, method):
    channel, stub, tally = rollout
    call = {
        "Generate": lambda r: stub.Generate(r, timeout=30),
        "GenerateStream": lambda r: list(stub.GenerateStream(r, timeout=30)),
    }[method]

    @f.FUZZ
    @given(generate_requests())
    def run(request):
        tally.call(method, lambda: call(request))

    run()
    tally.assert_enough(method)
    assert tally.seen[method]["OK"] > 0 and tally.seen[method]["INVALID_ARGUMENT"] > 0
    f.assert_serving(channel, SERVICE_NAME)


def test_fuzz_get_status(rollout):
    channel, _, tally = rollout
    call = f.raw_unary(channel, f"/{SERVICE_NAME}/GetStatus")

    @f.FUZZ
    @given(f.unknown_fields())
    def run(body):
        tally.call("GetStatus", lambda: call(body, timeout=10))

    run()
    tally.assert_enough("GetStatus")
    f.assert_serving(channel, SERVICE_NAME)
