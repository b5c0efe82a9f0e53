"""When the learner's WeightPublisher writes a keyframe instead of a delta."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from brorl.weights.store import WeightStore
from services.learner.publish import WeightPublisher


def weights(shift: float, n: int = 50):
    return lambda: {
        "w": (np.arange(n, dtype=np.float32) * 0.01 + shift),
        "b": np.ones(3, np.float32),
    }


def test_keyframes_at_the_start_every_k_versions_after_a_gap_and_on_a_shape_change(tmp_path):
    store = WeightStore(tmp_path)
    pub, pointers = WeightPublisher(store, "bf16", keyframe_every=3), []
    for v in range(5):
        pub.publish(weights(v * 0.5), pointers.append, v, step=v)
    pub.publish(weights(9.0), pointers.append, 7, step=7)  # versions jumped (a resumed run)
    pub.publish(weights(9.5, n=60), pointers.append, 8, step=8)  # a tensor changed shape
    pub.publish(weights(10.0, n=60), pointers.append, 9, step=9)
    assert [p.kind for p in pointers] == [
        "full",
        "delta",
        "delta",
        "full",
        "delta",
        "full",
        "full",
        "delta",
    ]
    manifest = json.loads((Path(pointers[4].uri) / "manifest.json").read_text())["serving"]
    assert manifest["keyframe"] == 3 and manifest["base_version"] == 3
    assert manifest["base_sha256"] == pointers[3].sha256
    assert manifest["changed"] < manifest["elements"] == 53  # the bias never changed
    fresh = WeightPublisher(store, "bf16", keyframe_every=3)  # a restarted learner
    fresh.publish(weights(11.0, n=60), pointers.append, 10, step=10)
    assert pointers[-1].kind == "full"


def test_the_publish_thread_overlaps_the_caller_keeps_order_and_raises_errors():
    import threading
    import time

    from services.learner.publish import PublishThread

    release, sent = threading.Event(), []

    def send(version, step, bits):
        release.wait(5)
        if bits is None:
            raise OSError("disk full")
        sent.append(version)

    thread = PublishThread(send)
    start = time.perf_counter()
    assert thread.submit(1, 1, {}) < 0.5  # nothing in flight yet: no wait
    assert time.perf_counter() - start < 0.5 and sent == []  # the caller goes on
    threading.Timer(0.3, release.set).start()
    assert thread.submit(2, 2, {}) >= 0.2  # waits for version 1 to be out first
    thread.join()
    assert sent == [1, 2] and thread.sent_s >= 0
    thread.submit(3, 3, None)
    with pytest.raises(OSError, match="disk full"):
        thread.join()  # the thread's error reaches the learner
    thread.close()


def test_in_the_caller_when_not_in_background():
    from services.learner.publish import PublishThread

    sent = []
    thread = PublishThread(lambda v, s, b: sent.append(v), background=False)
    thread.submit(1, 1, {})
    assert sent == [1]  # sent before submit returned
    thread.close()


def test_the_thread_start_hook_runs_once_on_the_thread_that_sends():
    import threading

    from services.learner.publish import PublishThread

    started, senders = [], []
    thread = PublishThread(
        lambda v, s, b: senders.append(threading.get_native_id()),
        on_thread_start=lambda: started.append(threading.get_native_id()),
    )
    for version in (1, 2, 3):
        thread.submit(version, version, {})
    thread.close()
    assert len(started) == 1 and senders == started * 3
    assert started[0] != threading.get_native_id()


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_snapshot_is_the_weights_at_its_time_not_after_the_next_update(tmp_path, dtype):
    store = WeightStore(tmp_path)
    pub, pointers = WeightPublisher(store, dtype, keyframe_every=3), []
    master = weights(0.0)()
    bits = pub.snapshot(master)
    for a in master.values():
        a += 1.0  # the next update runs while version 0 is published
    pub.publish_bits(bits, pointers.append, 0, step=0)
    expected = WeightPublisher(WeightStore(tmp_path / "b"), dtype).snapshot(weights(0.0)())
    assert all(np.array_equal(pub.last.bits[n], expected[n]) for n in expected)
