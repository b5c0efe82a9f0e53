"""StartRun refuses a run config that contradicts itself at once, with a one-line reason naming
the field, instead of a run that fails late (LearnerService served in this process over a real
loopback port, no Redis: the refusal comes before anything starts)."""

from __future__ import annotations

import grpc
import pytest

from brorl import rpc
from brorl.config.base import validate
from brorl.v1 import learner_pb2, learner_pb2_grpc
from services.learner.config import LearnerServiceConfig
from services.learner.server import SERVICE_NAME, LearnerServicer


@pytest.fixture
def stub(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "reference": "2"}\n')
    cfg = validate(
        LearnerServiceConfig,
        {"bind": "127.0.0.1:0", "runs_dir": str(tmp_path / "runs"), "read_roots": [str(tmp_path)]},
    )
    server = rpc.Server(cfg.bind, [SERVICE_NAME], max_workers=4)
    servicer = LearnerServicer(cfg, redis_client=None)
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server.grpc)
    server.start().set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")
    try:
        yield learner_pb2_grpc.LearnerServiceStub(channel), tmp_path, servicer
    finally:
        channel.close()
        server.stop(0)


@pytest.mark.parametrize(
    "sampling",
    [
        "{temperature: 0}",  # the default n is 512
        "{temperature: 0, n: 8}",
        "{temperature: 0, n: 1, budget: {kind: adaptive, total: 8, n_min: 1, n_max: 4}}",
    ],
)
def test_greedy_sampling_of_a_wide_group_is_refused_naming_the_temperature(stub, sampling):
    stub, tmp, servicer = stub
    config = f"model: {tmp}/m\ndata: {{train_path: {tmp}/d.jsonl}}\nsampling: {sampling}\n"
    with pytest.raises(grpc.RpcError) as err:
        stub.StartRun(learner_pb2.StartRunRequest(run_id="r", config_yaml=config), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    detail = err.value.details()
    assert detail.startswith("sampling.temperature:") and "\n" not in detail, detail
    assert "greedy" in detail and not servicer.runs
