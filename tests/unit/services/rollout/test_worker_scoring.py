"""The jobs of one engine call are scored in one ScoreBatch per reward function (and one per
verifier function), each path getting its own job's result; when the reward service refuses the
merged request, each job is scored alone so that only the refused job is dead-lettered."""

from __future__ import annotations

import grpc

from brorl import sampling
from brorl.contract import RewardStatus
from brorl.v1 import reward_pb2
from tests.memory_queue import MemoryChannels
from tests.unit.services.rollout.test_worker_loop import Refused, groups, put_job, worker_for


class ContentReward:
    """A result that depends on the item alone: its reference's value, plus 0.5 for the verifier
    function; INVALID_ARGUMENT for any request holding a reference ``bad``."""

    def __init__(self, max_batch: int = 4096):
        self.requests: list[reward_pb2.ScoreBatchRequest] = []
        self.timeouts: list[float] = []
        self.max_batch = max_batch

    def ScoreBatch(self, request, timeout=None):
        self.requests.append(request)
        self.timeouts.append(timeout)
        if any(i.reference == "bad" for i in request.items):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT)
        if len(request.items) > self.max_batch:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED)
        extra = 0.5 if request.reward_fn == "verifier" else 0.0
        return reward_pb2.ScoreBatchResponse(
            results=[
                reward_pb2.ScoreResult(
                    id=i.id, reward=float(i.reference) + extra, status=RewardStatus.OK
                )
                for i in request.items
            ]
        )


def claim_together(references: list[str], max_batch: int = 4096, **fields):
    channels, reward = MemoryChannels("r1"), ContentReward(max_batch)
    worker = worker_for(channels, reward=reward, batch_paths=64, reward_deadline_s=10.0)
    worker._claim_count = len(references)
    for i, ref in enumerate(references):
        put_job(channels, i, prompt=f"{i}+1=", reference=ref, **fields)
    worker.step()
    return channels, reward, {g.group_id: g for g in groups(channels)}


def test_the_jobs_of_one_call_are_scored_in_one_request_each_path_by_its_own_job():
    channels, reward, published = claim_together(["3", "5", "7"])
    [request] = reward.requests
    assert [i.reference for i in request.items] == ["3"] * 4 + ["5"] * 4 + ["7"] * 4
    assert [i.prompt for i in request.items][::4] == ["0+1=", "1+1=", "2+1="]
    for i, ref in enumerate(["3", "5", "7"]):
        g = published[f"g{i}"]
        assert [p.reward for p in g.paths] == [float(ref)] * 4
        assert g.score_seconds >= 0
    assert not channels.prompts.pending
    assert reward.timeouts == [30.0]  # the per-group deadline, once per group in the request


def test_the_verifier_of_the_calls_jobs_is_one_request_on_each_jobs_sample():
    share = 0.5
    _, reward, published = claim_together(["1", "2"], verifier_fn="verifier", verifier_sample=share)
    assert [r.reward_fn for r in reward.requests] == ["exact_match", "verifier"]
    sampled = [
        p.path_id
        for g in published.values()
        for p in g.paths
        if sampling.verifies(p.path_id, share)
    ]
    assert [i.id for i in reward.requests[1].items] == sampled and sampled
    for g in published.values():
        for p in g.paths:
            want = p.reward + 0.5 if p.path_id in sampled else 0.0
            assert p.verifier_reward == want


def test_a_refused_merged_request_dead_letters_only_the_refused_job():
    channels, reward, published = claim_together(["1", "bad", "2"])
    assert sorted(published) == ["g0", "g2"]
    assert [p.reward for p in published["g2"].paths] == [2.0] * 4
    assert [reason for _, reason in channels.prompts.dead] == [
        "reward service refused the job: bad job"
    ]
    assert [len(r.items) for r in reward.requests] == [12, 4, 4, 4]
    assert not channels.prompts.pending  # two published, one dead-lettered: all acked


def test_a_merged_request_over_the_services_max_batch_is_sent_job_by_job():
    channels, reward, published = claim_together(["1", "2"], max_batch=4)
    assert [len(r.items) for r in reward.requests] == [8, 4, 4]
    assert reward.timeouts == [20.0, 10.0, 10.0]
    assert [p.reward for p in published["g1"].paths] == [2.0] * 4
    assert not channels.prompts.dead and not channels.prompts.pending
