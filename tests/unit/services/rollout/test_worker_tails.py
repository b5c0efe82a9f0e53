"""An engine call's tail (select, score, publish) runs beside the next call's sampling in the
service's loop (services/rollout/tail/runners.py), one tail at a time, and nothing sampled is
lost to an earlier tail's failure or to the loop's stop."""

from __future__ import annotations

import threading
import time

import pytest

from services.rollout.tail.runners import Inline, TailThread
from tests.memory_queue import MemoryChannels
from tests.unit.services.rollout.test_worker_loop import (
    RecordingReward,
    TokenizingEngine,
    groups,
    put_job,
    worker_for,
)


def test_tails_run_in_order_one_at_a_time_and_run_waits_for_the_previous():
    runner, log, running = TailThread(), [], threading.Semaphore(1)

    def tail(i):
        def body():
            assert running.acquire(blocking=False), "two tails at once"
            time.sleep(0.02)
            log.append(i)
            running.release()

        return body

    for i in range(4):
        runner.run(tail(i), then=lambda: None)
    runner.close()
    assert log == [0, 1, 2, 3]
    assert runner.waited_s >= 0.04  # the 2nd..4th waited for the one before


def test_a_failed_tail_is_raised_at_the_next_hand_off_and_the_next_tail_still_runs():
    runner, ran, ended = TailThread(), [], []

    def fail():
        raise RuntimeError("reward service down")

    runner.run(fail, then=lambda: ended.append("lease 1"))
    with pytest.raises(RuntimeError, match="reward service down"):
        runner.run(lambda: ran.append(2), then=lambda: ended.append("lease 2"))
    runner.close()
    assert ran == [2] and ended == ["lease 1", "lease 2"]


def test_inline_runs_the_tail_at_once_and_ends_the_lease_when_it_fails():
    ended = []
    with pytest.raises(ValueError):
        Inline().run(lambda: int("x"), then=lambda: ended.append(True))
    assert ended == [True]


class SecondCallEngine(TokenizingEngine):
    """Signals when its second call starts."""

    def __init__(self):
        super().__init__()
        self.second_call = threading.Event()

    def generate(self, prompts, **kwargs):
        if self.calls:
            self.second_call.set()
        return super().generate(prompts, **kwargs)


class WaitingReward(RecordingReward):
    """Scores the first call only once the engine has begun the second (or after ``wait_s``)."""

    def __init__(self, engine: SecondCallEngine, wait_s: float):
        super().__init__()
        self.engine, self.wait_s, self.overlapped = engine, wait_s, []

    def ScoreBatch(self, request, timeout=None):
        if not self.overlapped:
            self.overlapped.append(self.engine.second_call.wait(self.wait_s))
        return super().ScoreBatch(request, timeout)


def run_three_jobs(wait_s: float, **options):
    channels = MemoryChannels("r1")
    engine = SecondCallEngine()
    reward = WaitingReward(engine, wait_s)
    worker = worker_for(channels, engine, reward, batch_paths=4, **options)  # a job a call
    for i in range(3):
        put_job(channels, i)
    stop = threading.Event()
    loop = threading.Thread(target=worker.run, args=(stop,))
    loop.start()
    deadline = time.monotonic() + 10
    while len(channels.paths.entries) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    loop.join(10)
    return channels, reward


def test_overlap_tail_off_finishes_each_call_before_the_next():
    _, reward = run_three_jobs(0.3, overlap_tail=False)
    assert reward.overlapped == [False]


def test_the_service_loop_scores_a_call_while_the_engine_samples_the_next():
    channels, reward = run_three_jobs(3.0)
    assert reward.overlapped == [True]  # the 1st call's scoring saw the 2nd call begin
    published = groups(channels)
    assert sorted(g.group_id for g in published) == ["g0", "g1", "g2"]
    assert all(len(g.paths) == 4 and "rollout/tail_wait_s" in g.stats for g in published)
    assert not channels.prompts.pending  # every job acked


def test_stopping_the_loop_still_publishes_the_call_it_sampled():
    channels = MemoryChannels("r1")
    stop = threading.Event()

    class StopAfterSampling(TokenizingEngine):
        def generate(self, prompts, **kwargs):
            stop.set()  # the loop stops after this call: its tail must still run
            return super().generate(prompts, **kwargs)

    worker = worker_for(channels, StopAfterSampling())
    put_job(channels, 0)
    worker.run(stop)
    assert [g.group_id for g in groups(channels)] == ["g0"]
    assert not channels.prompts.pending
