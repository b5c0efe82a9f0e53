"""A job names the oldest weight version it may be sampled with (PromptJob.min_weight_version,
set by the learner's feed: services/learner/feed/lookahead.py). The worker holds it until that
version is published and loaded, samples it at once when the engine has it already, gives up
after ``version_wait_s`` (sampling with what it has, counted), and on a stop leaves it pending."""

from __future__ import annotations

import threading
import time

import pytest

from brorl.weights.store import WeightStore
from services.rollout.worker import Stopping
from tests.memory_queue import MemoryChannels
from tests.unit.services.rollout.test_worker_loop import (
    TokenizingEngine,
    groups,
    put_job,
    worker_for,
)


def publish(store: WeightStore, channels, version: int) -> None:
    staging = store.staging_dir(version)
    (staging / "model.safetensors").write_bytes(b"w%d" % version)
    channels.publish_weights(store.commit(version, staging))


@pytest.fixture
def run(tmp_path):
    store = WeightStore(tmp_path / "weights")
    channels = MemoryChannels("r1")
    publish(store, channels, 1)
    engine = TokenizingEngine()
    return store, channels, engine, worker_for(channels, engine, watch_weights=False)


def test_a_job_waits_for_its_version_and_is_sampled_with_it(run):
    store, channels, engine, worker = run
    put_job(channels, min_weight_version=2)
    later = threading.Timer(0.3, publish, (store, channels, 2))
    later.start()
    start = time.monotonic()
    assert worker.step() is True
    waited = time.monotonic() - start
    later.join()
    [group] = groups(channels)
    assert group.weight_version == 2 and {p.weight_version for p in group.paths} == {2}
    assert engine.loads == [1, 2] and 0.25 < waited < 5
    assert 0.25 < group.stats["rollout/version_wait_s"] <= group.stats["rollout/idle_s"] + 0.1
    assert worker.version_waits_expired == 0


def test_a_job_whose_version_is_out_is_sampled_at_once(run):
    store, channels, engine, worker = run
    put_job(channels, min_weight_version=1)
    put_job(channels, i=1)  # 0: asks for nothing
    start = time.monotonic()
    worker.step()
    assert time.monotonic() - start < 5  # not held: a hold lasts version_wait_s (600 s)
    published = groups(channels)
    assert [g.weight_version for g in published] == [1, 1]
    assert all(g.stats["rollout/version_wait_s"] == 0 for g in published)


def test_past_the_wait_the_job_is_sampled_with_the_version_there_is(run):
    store, channels, engine, worker = run
    worker.version_wait_s = 0.2
    put_job(channels, min_weight_version=5)
    start = time.monotonic()
    worker.step()
    assert 0.2 <= time.monotonic() - start < 3
    [group] = groups(channels)
    assert group.weight_version == 1 and worker.version_waits_expired == 1
    assert group.stats["rollout/version_waits_expired"] == 1


def test_a_stop_while_waiting_leaves_the_job_pending(run):
    store, channels, engine, worker = run
    put_job(channels, min_weight_version=3)
    stop = threading.Event()
    worker._stop = stop
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(Stopping):
        worker.step()
    assert groups(channels) == [] and engine.calls == []
    assert channels.prompts.pending  # claimed, not acked: another worker takes it over
