"""A call's tail in the worker's tail process (services/rollout/tail/process.py): the groups are
scored by the real reward service and published on the real Redis by the child, as the worker,
and a failed or dead child loses no job."""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid

from concurrent import futures

import grpc
import pytest

from brorl import priority
from brorl import queue as q
from brorl.cluster import REDIS_URL
from brorl.v1 import common_pb2, reward_pb2_grpc
from services.reward.config import RewardServiceConfig
from services.rollout.config import RolloutServiceConfig
from services.rollout.tail.process import TailFailed, TailProcess, TailSpec
from services.rollout.worker import RolloutWorker, WorkerStats
from tests.memory_queue import MemoryRegistry
from tests.unit.services.rollout.test_worker_loop import RecordingReward, TokenizingEngine
from tests.waiting import wait_until

from tests.integration.conftest import reward_server

pytestmark = pytest.mark.redis


@pytest.fixture
def channels():
    client = q.connect(REDIS_URL)
    run = q.RunChannels(client, f"tail-{uuid.uuid4().hex[:8]}", namespace="tail-test")
    yield run
    for key in run.keys.values():
        client.delete(key)


@pytest.fixture(scope="module")
def reward_address():
    cfg = RewardServiceConfig(bind="127.0.0.1:0")
    with reward_server(cfg) as (server, _stub):
        yield f"127.0.0.1:{server.port}"


class Failing(reward_pb2_grpc.RewardServiceServicer):
    def ScoreBatch(self, request, context):
        context.abort(grpc.StatusCode.INTERNAL, "scorer crashed")


@pytest.fixture
def failing_address():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(Failing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def worker_with_tail_process(channels, reward_address: str, **config):
    stats = WorkerStats()
    spec = TailSpec(
        RolloutServiceConfig(
            model="unused",
            redis_url=REDIS_URL,
            reward_address=reward_address,
            namespace=channels.namespace,  # the child opens the run's channels itself
            **config,
        ),
        q.consumer_name(),
        log_level=logging.WARNING,
    )
    tail = TailProcess(spec, stats)
    worker = RolloutWorker(
        TokenizingEngine(),
        threading.Lock(),
        MemoryRegistry(),
        lambda run: channels,
        RecordingReward(),  # the worker's own reward stub: the child must not need it
        run_id=channels.run_id,
        stats=stats,
        finisher=tail,
    )
    return worker, tail


def put(channels, i: int, prompt: str = "1+1=") -> None:
    job = common_pb2.PromptJob(
        run_id=channels.run_id,
        job_id=f"{channels.run_id}/e/{i}/0",
        group_id=f"g{i}",
        prompt_id=f"p{i}",
        prompt=prompt,
        reference="c1",
        reward_fn="exact_match",
        part_count=1,
        sampling=common_pb2.SamplingParams(n=4, temperature=1.0),
    )
    channels.prompt_queue().put(job.SerializeToString())


def published(channels) -> list[common_pb2.PathGroup]:
    entries = channels.r.xrange(channels.keys["paths"])
    return [common_pb2.PathGroup.FromString(fields[b"data"]) for _, fields in entries]


def test_the_child_scores_and_publishes_the_calls_groups_as_the_worker(channels, reward_address):
    worker, tail = worker_with_tail_process(channels, reward_address)
    try:
        put(channels, 0)
        put(channels, 1)
        put(channels, 2, prompt="refuse me")
        assert worker.step()
        out = {g.group_id: g for g in published(channels)}
        assert tail.pid != os.getpid()
        assert set(out) == {"g0", "g1", "g2"}
        assert "longer than the maximum model length" in out["g2"].error
        for g in (out["g0"], out["g1"]):
            assert g.worker == worker.name and len(g.paths) == 4
            # exact_match against "c1", by the real reward service, in the child
            assert [p.reward for p in g.paths] == [0.0, 1.0, 0.0, 0.0]
        assert worker.rewards.stub.requests == []  # nothing scored in the worker's process
        assert worker.stats.groups_published == 2
        assert channels.prompt_queue().pending_count() == 0  # every job acked
    finally:
        tail.close()
    assert not tail._proc.is_alive()


def test_a_failed_call_leaves_its_jobs_pending_and_a_killed_child_is_replaced(
    channels, failing_address
):
    worker, tail = worker_with_tail_process(channels, failing_address)
    try:
        put(channels, 0)
        with pytest.raises(TailFailed, match="scorer crashed"):
            worker.step()
        assert published(channels) == []
        assert channels.prompt_queue().pending_count() == 1  # left to be reclaimed
        first = tail.pid
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: not tail._proc.is_alive(), what="the child is gone")
        put(channels, 1)
        with pytest.raises(TailFailed):
            worker.step()  # a new child, the same failing scorer
        assert tail.pid != first and tail._proc.is_alive()
    finally:
        tail.close()


def test_the_service_runs_its_tails_in_a_process_on_its_background_cores():
    from services.rollout.server import tail_process

    core = min(os.sched_getaffinity(0))
    config = RolloutServiceConfig(model="unused", background_cores=[core])
    tail = tail_process(config, WorkerStats())
    try:
        wait_until(lambda: os.sched_getaffinity(tail.pid) == {core}, what="the child on the cores")
    finally:
        tail.close()
    assert tail_process(config.model_copy(update={"tail_process": False}), WorkerStats()) is None


def test_a_lowered_tail_runs_in_a_session_of_its_own_below_the_worker():
    from services.rollout.server import tail_process

    ours = priority.autogroup_nice(os.getpid())
    config = RolloutServiceConfig(model="unused", tail_nice=13)
    tail = tail_process(config, WorkerStats())
    try:
        wait_until(lambda: os.getsid(tail.pid) == tail.pid, what="the child's own session")
        wait_until(lambda: os.getpriority(os.PRIO_PROCESS, tail.pid) == 13, what="its nice value")
        if priority.autogroups_on():  # the priority that counts against other sessions
            wait_until(lambda: priority.autogroup_nice(tail.pid) == 13, what="its autogroup's")
    finally:
        tail.close()
    assert not tail._proc.is_alive()  # stopped by its pid, outside our process group
    assert priority.autogroup_nice(os.getpid()) == ours
