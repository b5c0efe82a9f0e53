"""train.optimizer: AdamW everywhere; brorl's 1-bit Adam (onebit_adam.py) with 2+ learner ranks
at ZeRO stage 0, and a run config asking for it elsewhere is refused at StartRun with the
reason. DeepSpeed's removed 0/1 Adam is no option any more."""

from __future__ import annotations

import json

import grpc
import pytest

from brorl import rpc
from brorl.config.base import validate
from brorl.config.train import TrainConfig
from brorl.v1 import learner_pb2, learner_pb2_grpc
from services.learner.config import LearnerServiceConfig
from services.learner.model.deepspeed_engine import OWN_RANK_ENV, check_optimizer, launcher_world
from services.learner.server import SERVICE_NAME, LearnerServicer


def test_the_reasons_onebit_adam_cannot_run():
    train = TrainConfig(optimizer="onebit_adam")
    assert "needs ZeRO stage 0 (stage 2 here)" in check_optimizer(train, 2, world=4)
    assert "needs 2 or more learner ranks (1 here" in check_optimizer(train, 0, world=1)
    assert check_optimizer(train, 0, world=2) == ""  # CPU (gloo) or CUDA (NCCL) alike
    assert check_optimizer(train, 0, cuda=True, world=3) == ""
    assert check_optimizer(TrainConfig(), 3, world=1) == ""


def test_only_a_launchers_world_counts(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", OWN_RANK_ENV):
        monkeypatch.delenv(name, raising=False)
    assert launcher_world() is None
    monkeypatch.setenv("WORLD_SIZE", "4")  # no RANK: not one rank of a launched group
    assert launcher_world() is None
    monkeypatch.setenv("RANK", "2")
    assert launcher_world() == 4
    # inherited from a process that wrote them for its own one-rank group: no launcher's
    monkeypatch.setenv(OWN_RANK_ENV, "1")
    assert launcher_world() is None


def test_zero_one_adam_is_no_option():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="'adamw' or 'onebit_adam'"):
        TrainConfig(optimizer="zero_one_adam")


def test_start_run_refuses_onebit_adam_on_one_learner_rank(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1="}\n')
    cfg = validate(
        LearnerServiceConfig,
        {"bind": "127.0.0.1:0", "runs_dir": str(tmp_path / "runs"), "read_roots": [str(tmp_path)]},
    )
    server = rpc.Server(cfg.bind, [SERVICE_NAME])
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(
        LearnerServicer(cfg, redis_client=None), server.grpc
    )
    server.start().set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")
    try:
        stub = learner_pb2_grpc.LearnerServiceStub(channel)
        run = {
            "model": str(tmp_path / "model"),
            "data": {"train_path": str(tmp_path / "d.jsonl")},
            "train": {"optimizer": "onebit_adam"},
        }
        with pytest.raises(grpc.RpcError) as err:
            stub.StartRun(learner_pb2.StartRunRequest(config_yaml=json.dumps(run)), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(
            "train.optimizer: 1-bit Adam needs 2 or more learner ranks"
        )
        assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    finally:
        channel.close()
        server.stop(0)
