"""Fuzzed requests to every LearnerService RPC, served in this process over a real loopback port
(as test_server_security.py does, without Redis: no run gets far enough to need it): at least
500 random and boundary-valued requests each; every answer is OK or a status of the table below
(docs/reliability.md), never INTERNAL/UNKNOWN, and health says SERVING after."""

from __future__ import annotations

import grpc
import pytest
import yaml
from hypothesis import strategies as st
from hypothesis import given

from brorl import rpc
from brorl.config.base import validate
from brorl.v1 import learner_pb2, learner_pb2_grpc
from services.learner.config import LearnerServiceConfig
from services.learner.observe.runstate import RunState
from services.learner.server import SERVICE_NAME, LearnerServicer
from tests import fuzz_rpc as f

pytestmark = pytest.mark.slow

C = grpc.StatusCode
# The documented answers of each RPC. DEADLINE_EXCEEDED: WatchRun follows a run until it ends,
# so a watch of a live run ends at the caller's deadline (here every run has ended: it is not
# expected, but documented).
ALLOWED = {
    # INVALID_ARGUMENT: config or run_id malformed; PERMISSION_DENIED: a path outside read_roots;
    # FAILED_PRECONDITION: a run is live / run_id taken / nothing to resume
    "StartRun": {C.OK, C.INVALID_ARGUMENT, C.PERMISSION_DENIED, C.FAILED_PRECONDITION},
    "GetRun": {C.OK, C.NOT_FOUND},
    "WatchRun": {C.OK, C.NOT_FOUND, C.DEADLINE_EXCEEDED},
    "StopRun": {C.OK, C.NOT_FOUND},
    # FAILED_PRECONDITION: the run ended without a checkpoint
    "Checkpoint": {C.OK, C.NOT_FOUND, C.FAILED_PRECONDITION},
}
RUNS = ("done", "no-ckpt")  # ended runs the learner holds

run_ids = st.one_of(st.sampled_from(RUNS), f.text(80))
paths = st.one_of(
    f.text(60),
    st.sampled_from(["/etc/passwd", "/", ".", "..", "runs/../../etc", "/proc/self/environ"]),
)
scalars = st.one_of(st.none(), st.booleans(), f.int64(), st.floats(), f.text(30))
yaml_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(f.text(10), inner, max_size=3),
    max_leaves=8,
)
KEYS = ("reward_fn", "sampling", "explore", "train", "async", "unknown_key")


def configs():
    """Run configs: random text, YAML that nests too deep or aliases itself, and mappings with the
    real keys carrying random values and paths (inside and outside the read roots)."""
    structured = st.fixed_dictionaries(
        {"model": paths, "data": st.fixed_dictionaries({"train_path": paths})},
        optional={k: yaml_values for k in KEYS},
    ).map(lambda d: yaml.safe_dump(d, allow_unicode=True))
    hostile = st.sampled_from(
        [
            "[" * 10_000,
            "a: " + "[" * 5000 + "]" * 5000,
            "a: &x [1]\nb: *x\nc: *y",
            "\t",
            "!!python/object:os.system x",
            "%YAML 9.9\n---\na: 1",
            "{}",
            "[]",
            "- 1",
            "model: 1\ndata: 2",
        ]
    )
    return st.one_of(f.text(400), structured, hostile)


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("learner")
    cfg = validate(
        LearnerServiceConfig,
        {"bind": "127.0.0.1:0", "runs_dir": str(tmp / "runs"), "read_roots": [str(tmp / "in")]},
    )
    servicer = LearnerServicer(cfg, redis_client=None)
    for run_id in RUNS:
        run_dir = tmp / "runs" / run_id
        run_dir.mkdir(parents=True)
        state = RunState(run_id, run_dir, total_steps=2)
        for step in (0, 1):
            state.step = step
            state.emit({"learner/loss": 0.25})
        if run_id == "done":
            state.last_checkpoint = (str(run_dir / "checkpoints" / "step-1"), 1)
        state.finish("finished")
        servicer.runs[run_id] = state
    server = rpc.Server(cfg.bind, [SERVICE_NAME], max_workers=cfg.max_concurrent_rpcs)
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server.grpc)
    server.start().set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")  # the message limits of brorl clients
    try:
        yield channel, learner_pb2_grpc.LearnerServiceStub(channel), f.Tally(ALLOWED), servicer
    finally:
        channel.close()
        server.stop(0)


def test_the_table_covers_every_learner_rpc():
    methods = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"].methods_by_name
    assert set(ALLOWED) == set(methods)


def test_fuzz_start_run(learner):
    channel, stub, tally, servicer = learner

    @f.FUZZ
    @given(run_ids, configs(), st.booleans())
    def run(run_id, config_yaml, resume):
        request = learner_pb2.StartRunRequest(run_id=run_id, config_yaml=config_yaml, resume=resume)
        tally.call("StartRun", lambda: stub.StartRun(request, timeout=30))

    run()
    tally.assert_enough("StartRun")
    assert set(servicer.runs) == set(RUNS)  # no fuzzed config got as far as starting a run
    f.assert_serving(channel, SERVICE_NAME)


REQUESTS = {
    "GetRun": lambda s, r, _: s.GetRun(learner_pb2.GetRunRequest(run_id=r), timeout=10),
    "WatchRun": lambda s, r, step: list(
        s.WatchRun(learner_pb2.WatchRunRequest(run_id=r, from_step=step), timeout=10)
    ),
    "StopRun": lambda s, r, _: s.StopRun(learner_pb2.StopRunRequest(run_id=r), timeout=10),
    "Checkpoint": lambda s, r, _: s.Checkpoint(learner_pb2.CheckpointRequest(run_id=r), timeout=10),
}


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_fuzz_run_rpcs(learner, method):
    channel, stub, tally, _ = learner

    @f.FUZZ
    @given(run_ids, f.int64())
    def run(run_id, from_step):
        tally.call(method, lambda: REQUESTS[method](stub, run_id, from_step))

    run()
    tally.assert_enough(method)
    assert tally.seen[method]["OK"] > 0
    f.assert_serving(channel, SERVICE_NAME)
