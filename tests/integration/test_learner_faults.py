"""The learner against a real Redis: SIGKILLed and resumed, Redis restarted mid-run, a new run
under an earlier run's id, and nothing growing with the run's length (docs/reliability.md). The
rollout is a stand-in thread (the workers' side of a crash is tests/e2e/test_worker_crash.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis

from brorl import queue as q
from brorl import streams
from brorl.v1 import common_pb2
from services.learner.model.deepspeed_engine import OWN_RANK_ENV
from tests.integration.learner_faults_harness import (
    REPO,
    FakeRollout,
    PrivateRedis,
    answer_job,
    run_learner,
    trained_steps,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow]


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path / "redis").start()
    yield server
    server.stop()


def learner_process(url, run_id, run_dir, steps, resume=False) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "tests.integration.learner_faults_harness",
        url,
        run_id,
        str(run_dir),
        str(steps),
    ] + (["--resume"] if resume else [])
    log = open(run_dir.parent / f"learner-{time.monotonic_ns()}.log", "wb")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def steps_done(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    return max(trained_steps(run_dir), default=0) if path.exists() else 0


def test_sigkilled_learner_resumes_and_trains_every_group_exactly_once(tmp_path, private_redis):
    run_id, run_dir, steps = f"crash-{uuid.uuid4().hex[:6]}", tmp_path / "run", 16
    run_dir.mkdir()
    rollout = FakeRollout(private_redis.url, run_id)
    rollout.start()
    try:
        proc = learner_process(private_redis.url, run_id, run_dir, steps)
        # kill it at three different points: right after a checkpoint (step 3), between
        # checkpoints (step 8) and just before one (step 11); each restart resumes
        for kill_after in (3, 8, 11):
            wait_until(lambda: steps_done(run_dir) >= kill_after or proc.poll() is not None, 60)
            assert proc.poll() is None, "the learner ended before it could be killed"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc = learner_process(private_redis.url, run_id, run_dir, steps, resume=True)
        assert proc.wait(timeout=120) == 0
    finally:
        rollout.stop.set()
    trained = trained_steps(run_dir)
    assert sorted(trained) == list(range(1, steps + 1))  # reached its step count
    ids = [g for s in sorted(trained) for g in trained[s]]
    assert len(ids) == 2 * steps and len(set(ids)) == len(ids)  # each group once


def test_a_new_run_under_an_earlier_runs_id_takes_none_of_its_jobs_or_groups(
    tmp_path, private_redis
):
    """A run's streams outlive it by run_keys_ttl_s. A new run (not a resume) under the same id
    must not train on the earlier run's unconsumed groups (their ids, g<cursor>, are its own),
    nor leave its jobs to the workers: a worker holds a job for the weight version it asks for,
    which the new run makes only once its workers bring groups (a 2-step run hung 5 min so)."""
    run_id, run_dir = "again", tmp_path / "run"
    channels = q.RunChannels(redis.Redis.from_url(private_redis.url), run_id, namespace=run_id)
    jobs = channels.prompt_queue(consumer="gone")
    earlier = [
        common_pb2.PromptJob(
            run_id=run_id,
            job_id=f"{run_id}/earlier/{cursor}/0",
            group_id=f"g{cursor}",
            prompt_id=f"p{cursor}",
            prompt=f"{cursor}+1=",
            sampling=common_pb2.SamplingParams(n=4),
            min_weight_version=3,
        )
        for cursor in range(3)
    ]
    jobs.put(earlier[0].SerializeToString())
    assert jobs.read(count=1, block_ms=None)  # held by a worker that is gone: pending
    jobs.put(earlier[1].SerializeToString())  # never delivered
    late = answer_job(earlier[2], version=2)  # published after the earlier run's last step
    for path in late.paths:
        path.worker = "earlier"
    channels.path_queue().put(late.SerializeToString())

    done: dict = {}
    learner = threading.Thread(
        target=lambda: done.update(policy=run_learner(private_redis.url, run_id, run_dir, 6))
    )
    learner.start()
    # workers follow a run once it is announced, after its version 0
    wait_until(channels.read_weights, 60, what="the new run's version 0")
    rollout = FakeRollout(private_redis.url, run_id)
    rollout.start()
    try:
        learner.join(timeout=120)
    finally:
        rollout.stop.set()
    assert not learner.is_alive() and "policy" in done, "the new run did not finish"
    assert not {job.job_id for job in earlier} & set(rollout.job_ids)
    assert done["policy"].workers == {"fake"}


def test_checkpoints_carry_the_rng_state(tmp_path):
    import random

    import numpy as np
    import torch

    from services.learner.train import rng_state, set_rng_state

    saved = rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    set_rng_state(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_the_run_survives_a_redis_restart_and_10s_outage(tmp_path, private_redis):
    run_id, run_dir, steps = f"outage-{uuid.uuid4().hex[:6]}", tmp_path / "run", 12
    rollout = FakeRollout(private_redis.url, run_id)
    rollout.start()
    result: dict = {}

    def learn():
        try:
            result["policy"] = run_learner(private_redis.url, run_id, run_dir, steps)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    learner = threading.Thread(target=learn)
    learner.start()
    try:
        wait_until(lambda: steps_done(run_dir) >= 4, 60)
        private_redis.stop()  # down for 10 s, then back with its append-only file
        time.sleep(10)
        private_redis.start()
        learner.join(timeout=120)
    finally:
        rollout.stop.set()
    assert "error" not in result, result.get("error")
    ids = [g for update in result["policy"].updates for g in update]
    assert len(result["policy"].updates) == steps and len(set(ids)) == len(ids) == 2 * steps


def test_unreachable_redis_at_start_names_the_address():
    port = 1  # nothing listens there
    with pytest.raises(q.RedisUnavailable, match=f"Redis at redis://127.0.0.1:{port}/0"):
        q.connect(f"redis://127.0.0.1:{port}/0")
    # Started, as tests and launchers do, with a copy of an environment in which a process
    # joined its own one-rank group (the suite's own, after an in-process policy): that is no
    # launcher's, and its rendezvous port, now someone else's, must not be bound.
    taken = socket.create_server(("127.0.0.1", 0))
    leaked = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    leaked.update(MASTER_PORT=str(taken.getsockname()[1]), **{OWN_RANK_ENV: "1"})
    with taken:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.learner",
                "bind=127.0.0.1:0",
                f"redis_url=redis://127.0.0.1:{port}/0",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **leaked, "PYTHONPATH": str(REPO)},
        )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"error: Redis at redis://127.0.0.1:{port}/0 is unreachable" in out.stderr


def test_nothing_in_redis_grows_with_the_run(tmp_path, private_redis, monkeypatch):
    monkeypatch.setattr(streams, "DONE_WINDOW_S", 1)  # remember published job ids for 1 s
    run_id, run_dir, steps = f"long-{uuid.uuid4().hex[:6]}", tmp_path / "run", 60
    client = redis.Redis.from_url(private_redis.url)
    rollout = FakeRollout(private_redis.url, run_id)
    rollout.start()
    try:
        run_learner(private_redis.url, run_id, run_dir, steps)
    finally:
        rollout.stop.set()
    keys = q.keys(run_id, namespace=run_id)
    # consumed entries are deleted, not left to MAXLEN: what stays is the groups in flight when
    # the run ended (max_inflight_groups = 4), answered or not
    assert client.xlen(keys["paths"]) + client.xlen(keys["prompts"]) <= 4
    assert client.zcard(keys["done"]) < 60  # the last second's job ids, not all 120
    usage = sum(client.memory_usage(k) or 0 for k in keys.values())
    assert usage < 64_000, usage
    assert all(0 < client.ttl(k) <= 86_400 for k in keys.values() if client.exists(k))
