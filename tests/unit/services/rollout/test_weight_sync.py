"""The rollout worker's weight sync on real files (services/rollout/weight_sync.py): catching up,
a corrupt delta rejected and counted with a fallback to the keyframe, a stalled fetch reported
while the old version keeps serving; each with an engine that applies under the lock and one
that stages beside a call and swaps under the lock. A version staged beside a call is served
only after the swap; the watch stages a version published while the engine samples. The
engine here holds a real ServingState in-process, as the vLLM worker extension does
(tests/integration/test_engine_delta_sync.py: the real one)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from brorl.weights import codec
from brorl.weights.chain import ChainError, ChainResult, Held, ServingState
from services.rollout.weight_sync import WeightSync, weight_watch
from tests.memory_queue import MemoryChannels
from tests.waiting import wait_until
from tests.weight_versions import VersionRun


class StateEngine:
    """The engine's side of the sync: a serving state and the version the 'model' serves."""

    def __init__(self):
        self.state, self.loaded, self.weight_version = ServingState(), Held(), 0
        self.model: dict[str, np.ndarray] = {}
        self.applies = 0

    def apply_weight_chain(self, steps, run_id, careful) -> ChainResult:
        self.applies += 1
        error = None
        try:
            self.state.apply_chain(steps, run_id, careful)
        except ChainError as exc:
            error = {"version": exc.version, "reason": exc.reason}
        if self.state.held.version >= 0 and self.state.held != self.loaded:
            self.model = {n: b.copy() for n, b in self.state.tensors.items()}
            self.loaded, self.weight_version = self.state.held, self.state.held.version
        return ChainResult(self.state.held, self.loaded, error)


class StagingEngine(StateEngine):
    """An engine that ``stages_weights``: the state advanced and the model's next weights
    prepared beside a call, installed by ``swap_staged``; records where each stage ran."""

    stages_weights = True

    def __init__(self, lock=None):
        super().__init__()
        self.lock, self.staged, self.stages, self.swaps = lock, None, [], 0

    def stage_weight_chain(self, steps, run_id, careful) -> ChainResult:
        self.applies += 1
        locked = self.lock is not None and self.lock.locked()
        self.stages.append((threading.current_thread().name, locked, os.sched_getaffinity(0)))
        error = None
        try:
            self.state.apply_chain(steps, run_id, careful)
        except ChainError as exc:
            error = {"version": exc.version, "reason": exc.reason}
        self.staged = None
        if self.state.held.version >= 0 and self.state.held != self.loaded:
            self.staged = (self.state.held, {n: b.copy() for n, b in self.state.tensors.items()})
        return ChainResult(self.state.held, self.staged[0] if self.staged else self.loaded, error)

    def swap_staged(self) -> Held:
        self.swaps += 1
        if self.staged is not None:
            (self.loaded, self.model), self.staged = self.staged, None
            self.weight_version = self.loaded.version
        return self.loaded


@pytest.fixture(params=[StateEngine, StagingEngine], ids=["apply", "stage"])
def Engine(request):
    return request.param


def serving(engine: StateEngine, run: VersionRun, version: int) -> bool:
    want = run.expected[version]
    return engine.weight_version == version and all(
        np.array_equal(engine.model[n], b) for n, b in want.items()
    )


def test_a_worker_started_at_version_0_catches_up_from_version_20(tmp_path, Engine):
    run = VersionRun(tmp_path, keyframe_every=25, lr=1e-4)
    engine = Engine()
    sync = WeightSync(engine, threading.Lock(), deadline_s=5)
    assert sync.sync("r", run.publish()) and serving(engine, run, 0)
    run.publish_many(20)
    assert sync.sync("r", run.pointers[-1])
    assert serving(engine, run, 20) and engine.applies == 2
    assert not sync.sync("r", run.pointers[-1])  # nothing to do
    assert not sync.counts


def test_a_flipped_byte_in_a_delta_is_rejected_counted_and_recovered(tmp_path, Engine):
    run = VersionRun(tmp_path, keyframe_every=10, lr=1e-4)
    engine = Engine()
    sync = WeightSync(engine, threading.Lock(), deadline_s=5)
    run.publish_many(3)
    sync.sync("r", run.pointers[-1])
    run.publish_many(3)  # versions 3, 4, 5
    bad = Path(run.pointers[4].uri) / codec.DELTA_FILE
    data = bytearray(bad.read_bytes())
    data[-3] ^= 0x40
    bad.write_bytes(bytes(data))
    assert sync.sync("r", run.pointers[-1])
    assert serving(engine, run, 3)  # the deltas that verify
    assert sync.counts["rollout/weights_rejected"] == 1
    run.publish_many(3)  # 6..8 deltas chained through the bad one: nothing to apply
    assert not sync.sync("r", run.pointers[-1]) and serving(engine, run, 3)
    assert sync.counts["rollout/weights_rejected"] == 1  # known-bad: not re-read, not recounted
    run.publish_many(3)  # 9 delta, 10 keyframe, 11 delta
    assert sync.sync("r", run.pointers[-1]) and serving(engine, run, 11)


def test_a_reconstruction_that_fails_its_hashes_falls_back_to_the_keyframe(tmp_path, Engine):
    run = VersionRun(tmp_path, keyframe_every=10, lr=1e-4)
    engine = Engine()
    sync = WeightSync(engine, threading.Lock(), deadline_s=5)
    sync.sync("r", run.publish())
    run.publish_many(4)
    engine.state.tensors["layer.b"][0] ^= 1  # the held copy went bad behind the sync's back
    assert sync.sync("r", run.pointers[-1])
    assert serving(engine, run, 4)
    assert sync.counts["rollout/weights_rejected"] == 1
    assert sync.counts["rollout/weights_fallbacks"] == 1


def test_a_stalled_fetch_is_reported_and_the_old_version_keeps_serving(tmp_path, Engine):
    run = VersionRun(tmp_path, keyframe_every=10, lr=1e-4)
    engine = Engine()
    # the deadline leaves a loaded machine time for the first, healthy fetch
    sync = WeightSync(engine, threading.Lock(), deadline_s=1.0)
    sync.sync("r", run.publish())
    pointer = run.publish()
    # The delta's file becomes a FIFO with no writer: reading it blocks, like a hung share.
    delta = Path(pointer.uri) / codec.DELTA_FILE
    payload = delta.read_bytes()
    delta.unlink()
    os.mkfifo(delta)
    writer = None
    try:
        assert not sync.sync("r", pointer)  # returns after the deadline
        assert sync.counts["rollout/weights_fetch_stalls"] == 1
        assert serving(engine, run, 0)
        assert not sync.sync("r", pointer)  # still stalled: no wait, no second report
        assert sync.counts["rollout/weights_fetch_stalls"] == 1
        writer = threading.Thread(target=lambda: delta.write_bytes(payload))
        writer.start()  # the share answers again
        writer.join(5)
        wait_until(lambda: sync.sync("r", pointer), timeout=10)  # picked up when it ends
        assert serving(engine, run, 1)
        assert sync.counts["rollout/weights_fetch_stalls"] == 1
    finally:
        if writer is None:  # the test failed early: unblock the fetch thread if it waits
            try:
                fd = os.open(delta, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                fd = None  # nobody is reading it
            if fd is not None:
                os.write(fd, payload)
                os.close(fd)


def test_a_corrupt_newest_delta_leaves_the_worker_on_the_version_before(tmp_path, Engine):
    run = VersionRun(tmp_path, keyframe_every=10, lr=1e-4)
    engine = Engine()
    sync = WeightSync(engine, threading.Lock(), deadline_s=5)
    sync.sync("r", run.publish())
    run.publish_many(2)
    bad = Path(run.pointers[2].uri) / codec.DELTA_FILE
    bad.write_bytes(bad.read_bytes()[:-1])  # truncated
    assert sync.sync("r", run.pointers[-1]) and serving(engine, run, 1)
    assert sync.counts["rollout/weights_rejected"] == 1
    assert not sync.sync("r", run.pointers[-1])  # the same pointer is not tried again
    assert sync.counts["rollout/weights_rejected"] == 1


def test_a_version_staged_beside_a_call_is_served_only_after_the_swap(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=10, lr=1e-4)
    lock = threading.Lock()
    engine = StagingEngine(lock)
    sync = WeightSync(engine, lock, deadline_s=5)
    assert sync.sync("r", run.publish()) and serving(engine, run, 0)
    pointer = run.publish()
    with lock:  # the engine is sampling a call
        sync.prefetch("r", pointer)
        sync._fetch.thread.join(5)
        assert serving(engine, run, 0)  # staged, not served
        sync.prefetch("r", pointer)  # staged already: not fetched again
    assert len(engine.stages) == 2 and engine.stages[-1][:2] == ("weight-fetch", True)
    assert sync.sync("r", pointer) and serving(engine, run, 1)
    assert len(engine.stages) == 2 and engine.swaps == 2  # the sync only swapped it in
    assert not sync.sync("r", pointer)
    sync.prefetch("r", pointer)  # nothing to do
    assert sync._fetch is None


def test_a_prefetch_of_another_run_or_an_older_version_is_not_what_the_next_call_serves(
    tmp_path,
):
    old = VersionRun(tmp_path / "old", keyframe_every=10, lr=1e-4)
    new = VersionRun(tmp_path / "new", keyframe_every=10, lr=3e-4, seed=1)
    engine = StagingEngine()
    sync = WeightSync(engine, threading.Lock(), deadline_s=5)
    sync.sync("old", old.publish())
    sync.prefetch("old", old.publish())  # the old run's last version, announced as it ends
    assert sync.sync("new", new.publish())  # the new run's first call
    assert sync.loaded_run == "new" and serving(engine, new, 0)
    new.publish_many(2)
    sync.prefetch("new", new.pointers[1])
    sync._fetch.thread.join(5)
    assert sync.sync("new", new.pointers[2]) and serving(engine, new, 2)  # not version 1


def test_the_watch_stages_a_version_announced_while_the_engine_samples(tmp_path):
    run = VersionRun(tmp_path, keyframe_every=10, lr=1e-4)
    engine = StagingEngine()
    sync = WeightSync(engine, threading.Lock(), deadline_s=5)
    sync.sync("r", run.publish())
    channels = MemoryChannels("r")
    followed = {"run": ("", None)}  # no run yet: the watch waits for one
    with weight_watch(sync, lambda: followed["run"]):
        followed["run"] = ("r", channels)
        wait_until(lambda: channels.listeners, timeout=5)
        channels.publish_weights(pointer := run.publish())
        wait_until(lambda: len(engine.stages) == 2, timeout=5)
        assert serving(engine, run, 0)  # staged, not served
    assert channels.listeners == []  # the watch ended and unsubscribed
    assert sync.sync("r", pointer) and serving(engine, run, 1)
    assert len(engine.stages) == 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell apart")
def test_the_staging_runs_on_the_background_cores_too(tmp_path):
    own, other = sorted(os.sched_getaffinity(0))[:2]
    run = VersionRun(tmp_path, keyframe_every=10, lr=1e-4)
    engine = StagingEngine()
    sync = WeightSync(engine, threading.Lock(), deadline_s=5, background_cores=[other])

    def pinned_worker():  # a worker pinned to one core starts the fetch threads
        os.sched_setaffinity(0, {own})
        sync.sync("r", run.publish())

    worker = threading.Thread(target=pinned_worker)
    worker.start()
    worker.join(10)
    assert serving(engine, run, 0) and engine.stages[0][2] == {own, other}
