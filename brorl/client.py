"""Thin clients of the three services (every call has a deadline; ``security``: the token and
TLS settings of a secured cluster, docs/security.md)."""

from __future__ import annotations

from pathlib import Path

from brorl import rpc
from brorl.contract import LearnerWaits
from brorl.security import SecurityConfig
from brorl.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)


class LearnerClient:
    def __init__(
        self,
        address: str,
        deadline_s: float = rpc.DEFAULT_DEADLINE_S,
        security: SecurityConfig | None = None,
    ):
        self.channel = rpc.channel(address, security)
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)
        self.deadline = deadline_s

    def start(
        self, config_yaml: str, run_id: str = "", resume: bool = False
    ) -> learner_pb2.RunInfo:
        return self.stub.StartRun(
            learner_pb2.StartRunRequest(run_id=run_id, config_yaml=config_yaml, resume=resume),
            timeout=LearnerWaits.START_S,
        )

    def start_file(
        self, path: str | Path, run_id: str = "", resume: bool = False
    ) -> learner_pb2.RunInfo:
        return self.start(Path(path).read_text(), run_id, resume)

    def get(self, run_id: str) -> learner_pb2.RunInfo:
        return self.stub.GetRun(learner_pb2.GetRunRequest(run_id=run_id), timeout=self.deadline)

    def watch(self, run_id: str, from_step: int = 0, timeout: float | None = 24 * 3600):
        return self.stub.WatchRun(
            learner_pb2.WatchRunRequest(run_id=run_id, from_step=from_step), timeout=timeout
        )

    def stop(self, run_id: str) -> learner_pb2.RunInfo:
        return self.stub.StopRun(
            learner_pb2.StopRunRequest(run_id=run_id),
            timeout=LearnerWaits.deadline(LearnerWaits.STOP_S),
        )

    def checkpoint(self, run_id: str) -> learner_pb2.CheckpointResponse:
        return self.stub.Checkpoint(
            learner_pb2.CheckpointRequest(run_id=run_id),
            timeout=LearnerWaits.deadline(LearnerWaits.CHECKPOINT_S),
        )

    def close(self) -> None:
        self.channel.close()


class RewardClient:
    def __init__(
        self,
        address: str,
        deadline_s: float = rpc.DEFAULT_DEADLINE_S,
        security: SecurityConfig | None = None,
    ):
        self.channel = rpc.channel(address, security)
        self.stub = reward_pb2_grpc.RewardServiceStub(self.channel)
        self.deadline = deadline_s

    def score_batch(self, reward_fn: str, items: list[dict]) -> reward_pb2.ScoreBatchResponse:
        request = reward_pb2.ScoreBatchRequest(
            reward_fn=reward_fn, items=[reward_pb2.ScoreRequest(**i) for i in items]
        )
        return self.stub.ScoreBatch(request, timeout=self.deadline)

    def list(self) -> reward_pb2.ListRewardFunctionsResponse:
        return self.stub.ListRewardFunctions(
            reward_pb2.ListRewardFunctionsRequest(), timeout=self.deadline
        )


class RolloutClient:
    def __init__(
        self,
        address: str,
        deadline_s: float = 300.0,
        security: SecurityConfig | None = None,
    ):
        self.channel = rpc.channel(address, security)
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)
        self.deadline = deadline_s

    def generate(self, prompt: str, **sampling) -> rollout_pb2.GenerateResponse:
        request = rollout_pb2.GenerateRequest(
            prompt=prompt, sampling=common_pb2.SamplingParams(**sampling)
        )
        return self.stub.Generate(request, timeout=self.deadline)

    def status(self) -> rollout_pb2.RolloutStatus:
        return self.stub.GetStatus(rollout_pb2.RolloutStatusRequest(), timeout=self.deadline)
