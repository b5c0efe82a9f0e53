"""The series each service adds to its /metrics besides the RPC ones (docs/observability.md):
the reward service's scored paths by function and status and its reward histogram (a real
in-process RewardService over gRPC), the rollout worker's counters and weight version, and the
learner's view of its run's streams (real Redis)."""

from __future__ import annotations

import uuid

import pytest

from brorl import rpc
from brorl.config.base import validate
from brorl.queue import RunChannels, connect
from brorl.v1 import reward_pb2, reward_pb2_grpc
from services.learner.observe.live_metrics import queue_samples
from services.reward.config import RewardServiceConfig
from services.reward.server import build_server
from services.rollout.server import worker_samples
from services.rollout.worker import WorkerStats


def test_reward_service_counts_scored_paths_and_their_rewards():
    server = build_server(validate(RewardServiceConfig, {"bind": "127.0.0.1:0"})).start()
    server.set_serving(True)
    try:
        stub = reward_pb2_grpc.RewardServiceStub(rpc.channel(f"127.0.0.1:{server.port}"))
        items = [
            reward_pb2.ScoreRequest(id=str(i), completion=c, reference="7")
            for i, c in enumerate(["7", "7", "8", " 7", "x"])
        ]
        resp = stub.ScoreBatch(
            reward_pb2.ScoreBatchRequest(reward_fn="exact_match", items=items), timeout=10
        )
        stub.Score(
            reward_pb2.ScoreRequest(reward_fn="exact_match", completion="7", reference="7"),
            timeout=10,
        )
    finally:
        server.stop(0)
    value = server.metrics.registry.get_sample_value
    rewards = [r.reward for r in resp.results] + [1.0]
    assert value("brorl_reward_scored_total", {"fn": "exact_match", "status": "ok"}) == 6
    assert value("brorl_reward_value_count", {"fn": "exact_match"}) == 6
    assert value("brorl_reward_score_count", {"fn": "exact_match"}) == 6
    assert value("brorl_reward_score_sum", {"fn": "exact_match"}) == pytest.approx(sum(rewards))
    at_most_zero = sum(r <= 0 for r in rewards)
    assert value("brorl_reward_value_bucket", {"fn": "exact_match", "le": "0.0"}) == at_most_zero
    labels = {"service": "brorl.v1.RewardService", "method": "ScoreBatch"}
    assert value("brorl_rpc_latency_seconds_count", labels) == 1
    assert value("brorl_rpc_requests_total", {**labels, "code": "OK"}) == 1


class _Servicer:  # the two attributes worker_samples reads from a RolloutServicer
    def __init__(self, engine):
        self.name, self.engine = "host-1", engine
        self.stats = WorkerStats(paths_generated=512, tokens_generated=2048, groups_published=1)


class _Engine:
    weight_version = 3


def test_rollout_worker_counters_and_weight_version():
    samples = {(s.name, s.kind): s for s in worker_samples(_Servicer(_Engine()))}
    assert samples["rollout_paths_total", "counter"].value == 512
    assert samples["rollout_tokens_total", "counter"].value == 2048
    assert samples["rollout_groups_published_total", "counter"].value == 1
    assert samples["rollout_weight_version", "gauge"].value == 3
    assert all(s.labels == {"worker": "host-1"} for s in samples.values())
    loading = {s.name: s.value for s in worker_samples(_Servicer(None))}
    assert loading["rollout_weight_version"] == 0 and loading["rollout_engine_ready"] == 0


@pytest.mark.redis
def test_learner_sees_length_lag_and_pending_of_its_run_streams():
    client = connect("redis://127.0.0.1:6379/0")
    run_id = f"test-metrics-{uuid.uuid4().hex[:8]}"
    channels = RunChannels(client, run_id, namespace="test")
    try:
        assert {(s.name, s.labels["stream"]): s.value for s in queue_samples(lambda: channels)} == {
            (f"queue_{w}", stream): 0
            for w in ("length", "lag", "pending")
            for stream in ("prompts", "paths")
        }
        prompts = channels.prompt_queue()
        for i in range(5):
            prompts.put(b"job%d" % i)
        worker = channels.prompt_queue(consumer="w1")
        worker.read(count=2, block_ms=100)
        channels.path_queue().put(b"group")
        got = {(s.name, s.labels["stream"]): s.value for s in queue_samples(lambda: channels)}
        assert got[("queue_length", "prompts")] == 5
        assert got[("queue_pending", "prompts")] == 2
        assert got[("queue_lag", "prompts")] == 3
        assert got[("queue_length", "paths")] == 1 and got[("queue_lag", "paths")] == 1
        # a consumed job is deleted (publish-once): Redis may then not know the lag
        [d] = worker.read(count=1, block_ms=100)
        worker.ack_and_delete(d.entry_id)
        got = {(s.name, s.labels["stream"]): s.value for s in queue_samples(lambda: channels)}
        assert got[("queue_length", "prompts")] == 4
        assert got[("queue_pending", "prompts")] == 2
        assert got[("queue_lag", "prompts")] == 2
        assert queue_samples(lambda: None) == []
    finally:
        client.delete(*channels.keys.values())
