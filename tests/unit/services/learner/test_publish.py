"""When the learner's WeightPublisher writes a keyframe instead of a delta."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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
