"""The real-engine pass of the rollout fuzz test (the stand-in engine's pass, 500 requests per RPC,
is tests/unit/services/rollout/test_fuzz_rollout.py): a rollout process with the tiny model's vLLM
engine gets random and boundary-valued Generate requests. vLLM's own validation (a prompt longer
than the context, max_tokens, seeds, stop strings) must come back INVALID_ARGUMENT, never
INTERNAL/UNKNOWN, and the engine must still generate afterwards."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brorl import rpc
from brorl.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from tests import fuzz_rpc as f
from tests.unit.services.rollout.test_fuzz_rollout import ALLOWED, generate_requests

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
MAX_N = 64  # as the stand-in pass: its strategies' boundaries are around this
EXAMPLES = 150  # a vLLM call is slower than the stand-in's; the boundaries come early anyway


def engine_requests():
    """Requests the engine should answer: a short prompt the tiny model's tokenizer can spell
    (it has no tokens for most characters: those prompts encode to nothing and are refused),
    a few tokens, sampling within range. Half the fuzzed requests are drawn from these, so that
    the engine is reached in every run (from the stand-in's strategy alone 8-43 of 150 reached
    it in three runs, and none in one run of the suite under load)."""
    return st.builds(
        rollout_pb2.GenerateRequest,
        prompt=st.text("0123456789+=", min_size=1, max_size=12),
        sampling=st.builds(
            common_pb2.SamplingParams,
            n=st.integers(1, MAX_N),
            temperature=st.floats(0.0625, 2.0, width=32),
            top_k=st.integers(-1, 100),
            top_p=st.floats(0.0625, 1.0, width=32),
            max_tokens=st.integers(1, 8),
            seed=st.integers(0, 2**31 - 1),
        ),
    )


def test_real_engine_answers_fuzzed_generate_with_documented_codes(services, tiny_model):
    proc = services(
        "rollout", model=tiny_model, worker_loop="false", max_n=MAX_N, **{"engine.seed": 0}
    )
    proc.wait_serving()
    channel = rpc.channel(proc.address)
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    tally = f.Tally(ALLOWED)

    @settings(f.FUZZ, max_examples=EXAMPLES)
    @given(st.one_of(engine_requests(), generate_requests()))
    def run(request):
        tally.call("Generate", lambda: stub.Generate(request, timeout=120))

    run()
    seen = dict(tally.seen["Generate"])
    assert seen.get("OK", 0) > 0 and seen.get("INVALID_ARGUMENT", 0) > 0, seen
    f.assert_serving(channel, "brorl.v1.RolloutService")
    ok = stub.Generate(
        rollout_pb2.GenerateRequest(
            prompt="12+34=", sampling=common_pb2.SamplingParams(n=2, temperature=1.0)
        ),
        timeout=120,
    )
    assert len(ok.paths) == 2 and proc.popen.poll() is None
    channel.close()
    assert grpc.StatusCode.INTERNAL.name not in seen
