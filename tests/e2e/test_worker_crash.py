"""A rollout worker is SIGKILLed in the middle of a prompt job: the other worker reclaims the
job and its paths reach the learner's stream exactly once (counted by path id)."""

import socket
import threading
import time
import uuid

import pytest

from brorl import queue as q
from brorl import rpc
from brorl.v1 import common_pb2, reward_pb2, reward_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


class SlowReward(reward_pb2_grpc.RewardServiceServicer):
    """Stands in for the reward service (covered by its own tests) so the kill lands mid-job."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.calls: list[int] = []
        self.called = threading.Event()

    def ScoreBatch(self, request, context):
        self.calls.append(len(request.items))
        self.called.set()
        time.sleep(self.delay_s)
        return reward_pb2.ScoreBatchResponse(
            results=[
                reward_pb2.ScoreResult(
                    id=i.id, reward=float(i.completion.strip() == i.reference), status="ok"
                )
                for i in request.items
            ]
        )


def test_killed_worker_job_is_reclaimed_and_published_once(services, tiny_model):
    run_id, namespace = f"crash-{uuid.uuid4().hex[:8]}", f"crash-{uuid.uuid4().hex[:8]}"
    keys = q.keys(run_id, namespace=namespace)  # the workers' keys, not the default namespace's
    r = q.connect("redis://127.0.0.1:6379/0")
    slow = SlowReward(delay_s=4.0)
    server = rpc.Server("127.0.0.1:0", ["brorl.v1.RewardService"])
    reward_pb2_grpc.add_RewardServiceServicer_to_server(slow, server.grpc)
    server.start().set_serving(True)
    try:
        common = dict(
            model=tiny_model,
            run_id=run_id,
            namespace=namespace,
            reward_address=f"127.0.0.1:{server.port}",
            claim_idle_ms=3000,
        )
        workers = [services("rollout", name=f"w{i}", **common) for i in range(2)]
        for w in workers:
            w.wait_serving()
        prompts = q.StreamQueue(r, keys["prompts"], "rollout")
        n = 256
        job = common_pb2.PromptJob(
            run_id=run_id,
            job_id=f"{run_id}/0",
            group_id="g0",
            prompt_id="p0",
            prompt="12+34=",
            reference="46",
            reward_fn="math_answer",
            sampling=common_pb2.SamplingParams(n=n, temperature=1.0, max_tokens=6),
        )
        prompts.put(job.SerializeToString())

        assert slow.called.wait(120), "no worker scored the job"
        [pending] = r.xpending_range(keys["prompts"], "rollout", min="-", max="+", count=10)
        holder = pending["consumer"].decode()
        victim = next(w for w in workers if holder == f"{socket.gethostname()}-{w.pid}")
        survivor = next(w for w in workers if w is not victim)
        assert r.xlen(keys["paths"]) == 0  # killed before it published anything
        victim.kill()

        deadline = time.monotonic() + 120
        while r.xlen(keys["paths"]) == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.0)  # a duplicate, if any, would land now
        learner = q.StreamQueue(r, keys["paths"], "learner")
        deliveries = learner.read(count=10, block_ms=500)
        assert len(deliveries) == 1, f"expected one group, got {len(deliveries)}"
        group = common_pb2.PathGroup.FromString(deliveries[0].data)
        path_ids = [p.path_id for p in group.paths]
        assert len(path_ids) == n and len(set(path_ids)) == n
        assert group.worker == f"{socket.gethostname()}-{survivor.pid}"
        assert len(slow.calls) == 2  # scored by the victim (lost) and by the survivor
        assert r.xpending(keys["prompts"], "rollout")["pending"] == 0
    finally:
        server.stop()
        r.delete(*keys.values())
