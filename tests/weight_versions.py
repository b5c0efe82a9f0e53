"""Publishing a run of weight versions with the learner's real publisher, for the delta-sync
tests: fp32 master weights that move by Adam-sized steps, so that the serving-dtype deltas are
as sparse as a real run's."""

from __future__ import annotations

import numpy as np

from brorl.weights import codec
from brorl.weights.store import WeightStore
from services.learner.publish import WeightPublisher

SHAPES = {"model.embed_tokens.weight": (37, 16), "layer.w": (16, 48), "layer.b": (48,), "n": (5,)}


class VersionRun:
    """A learner stand-in: ``publish()`` moves the master weights one step and publishes."""

    def __init__(self, root, dtype="bf16", keyframe_every=10, lr=1e-3, seed=0):
        self.rng = np.random.default_rng(seed)
        self.master = {
            n: (self.rng.standard_normal(s) * 0.02).astype(np.float32) for n, s in SHAPES.items()
        }
        self.store = WeightStore(root)
        self.publisher = WeightPublisher(self.store, dtype, keyframe_every)
        self.dtype, self.lr = dtype, lr
        self.pointers = []
        self.expected: dict[int, dict[str, np.ndarray]] = {}  # version -> serving bits

    def publish(self, version: int | None = None):
        version = len(self.pointers) if version is None else version
        if self.pointers:
            for w in self.master.values():
                w -= self.lr * np.sign(self.rng.standard_normal(w.shape)).astype(np.float32)
        pointer = self.publisher.publish(
            lambda: {n: w.copy() for n, w in self.master.items()},
            self.pointers.append,
            version,
            step=version,
        )
        self.expected[version] = {
            n: codec.serving_bits(w, self.dtype) for n, w in self.master.items()
        }
        return pointer

    def publish_many(self, count: int):
        return [self.publish() for _ in range(count)]
