"""The rollout worker runs the run's held-out verifier on its sample of each group's paths
(brorl.sampling.verifies), beside the training reward; unsampled paths carry no verifier score."""

from __future__ import annotations

import threading

from brorl import sampling
from brorl.v1 import common_pb2, reward_pb2
from services.rollout.worker import RolloutWorker
from tests.memory_queue import MemoryChannels, MemoryRegistry
from tests.unit.brorl.test_sampling_contract import RecordingEngine


class ByFunctionReward:
    """Training reward 1.0, verifier 0.25 (status ok), recording each call's function and ids."""

    def __init__(self):
        self.calls: list[tuple[str, list[str]]] = []

    def ScoreBatch(self, request, timeout=None):
        self.calls.append((request.reward_fn, [i.id for i in request.items]))
        reward = 1.0 if request.reward_fn == "proxy" else 0.25
        return reward_pb2.ScoreBatchResponse(
            results=[
                reward_pb2.ScoreResult(id=i.id, reward=reward, status="ok") for i in request.items
            ]
        )


def run_job(verifier_fn: str, share: float, n: int = 64):
    channels, reward = MemoryChannels("r1"), ByFunctionReward()
    worker = RolloutWorker(
        RecordingEngine(),
        threading.Lock(),
        MemoryRegistry(),
        lambda run: channels,
        reward,
        run_id="r1",
    )
    job = common_pb2.PromptJob(
        run_id="r1",
        job_id="r1/e/0/0",
        group_id="g0",
        prompt="1+1=",
        part_count=1,
        reward_fn="proxy",
        verifier_fn=verifier_fn,
        verifier_sample=share,
        sampling=common_pb2.SamplingParams(n=n, temperature=1.0),
    )
    channels.prompts.put(job.SerializeToString())
    worker.step()
    [d] = channels.paths.read(count=1)
    return common_pb2.PathGroup.FromString(d.data), reward.calls


def test_the_verifier_scores_exactly_the_hashed_sample():
    group, calls = run_job("exact", 0.25)
    sample = [p.path_id for p in group.paths if sampling.verifies(p.path_id, 0.25)]
    assert 0 < len(sample) < len(group.paths)
    assert calls == [("proxy", [p.path_id for p in group.paths]), ("exact", sample)]
    for p in group.paths:
        assert p.reward == 1.0  # the training reward is the run's reward_fn, always
        if p.path_id in sample:
            assert (p.verifier_reward, p.verifier_status) == (0.25, "ok")
        else:
            assert (p.verifier_reward, p.verifier_status) == (0.0, "")


def test_no_verifier_no_second_call():
    group, calls = run_job("", 0.25)
    assert [fn for fn, _ in calls] == ["proxy"]
    assert all(p.verifier_status == "" for p in group.paths)
