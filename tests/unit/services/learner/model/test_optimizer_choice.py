"""train.optimizer: AdamW everywhere; DeepSpeed's 1-bit / 0/1 Adam only where they can run,
and a run config asking for them elsewhere is refused at StartRun with the reason."""

from __future__ import annotations

import json

import grpc
import pytest

from brorl import rpc
from brorl.config.base import validate
from brorl.config.train import TrainConfig
from brorl.v1 import learner_pb2, learner_pb2_grpc
from services.learner.config import LearnerServiceConfig
from services.learner.model.deepspeed_engine import check_optimizer
from services.learner.server import SERVICE_NAME, LearnerServicer


@pytest.mark.parametrize("name", ["onebit_adam", "zero_one_adam"])
def test_the_reasons_a_compressed_adam_cannot_run(name):
    train = TrainConfig(optimizer=name)
    assert "needs CUDA and NCCL" in check_optimizer(train, 0, cuda=False)
    assert "does not work with ZeRO (stage 2" in check_optimizer(train, 2, cuda=True)
    import deepspeed

    # DeepSpeed 0.19.8 (the pinned one) removed them: refused even on CUDA, naming why
    assert f"DeepSpeed {deepspeed.__version__} has no" in check_optimizer(train, 0, cuda=True)
    assert check_optimizer(TrainConfig(), 3, cuda=False) == ""


def test_start_run_refuses_onebit_adam_on_this_learner(tmp_path):
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
        assert err.value.details().startswith("train.optimizer: OneBitAdam needs CUDA")
        assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    finally:
        channel.close()
        server.stop(0)


@pytest.mark.gpu
def test_onebit_adam_trains_on_cuda(tmp_path):
    """Where DeepSpeed still has 1-bit Adam (CUDA, NCCL): the learner's update runs with it."""
    from services.learner.model.policy import Policy
    from tests.unit.services.learner.model.test_policy_nonfinite import groups
    from tests.unit.services.learner.tiny_model import tiny_qwen2

    train = TrainConfig(optimizer="onebit_adam", onebit_freeze_steps=1, lr=1e-2)
    reason = check_optimizer(train, 0, cuda=True)
    if reason:
        pytest.skip(reason)
    tiny_qwen2().save_pretrained(tmp_path)
    policy = Policy(str(tmp_path), train)
    before = [p.detach().clone() for p in policy.model.parameters()]
    for _ in range(3):  # warm-up step, then compressed steps
        out = policy.update(groups())
        assert not out.get("learner/skipped_step")
    moved = max(
        (p.detach() - b).abs().max().item() for p, b in zip(policy.model.parameters(), before)
    )
    assert moved > 0
