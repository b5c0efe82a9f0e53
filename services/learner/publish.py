"""Publishing weight versions (keyframes and deltas in the weight store + Redis pointer) and
the final HF export."""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from brorl.weights import codec
from brorl.v1 import common_pb2
from brorl.weights.store import WeightStore

log = logging.getLogger(__name__)


@dataclass
class _Published:
    version: int
    sha256: str  # of the manifest
    keyframe: int
    bits: dict[str, np.ndarray]  # the serving-dtype state workers reconstruct


class WeightPublisher:
    """Publishes weight versions in the serving dtype: a keyframe every ``keyframe_every``
    versions (and whenever the previous version is not the one before), a delta of the bits
    against the previous version otherwise (brorl.weights.codec; docs/weights.md). It keeps the
    last published bits to diff against: a restarted learner starts with a keyframe."""

    def __init__(self, store: WeightStore, serving_dtype: str = "bf16", keyframe_every: int = 10):
        codec.bit_type(serving_dtype)
        self.store, self.dtype, self.keyframe_every = store, serving_dtype, keyframe_every
        self.last: _Published | None = None

    def snapshot(self, master: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The serving-dtype bits of ``master`` (float32 arrays, HF names): a copy, so the
        update that follows may change ``master`` while these bits are published."""
        names = list(master)
        rounded = codec.parallel_map(lambda n: codec.serving_bits(master[n], self.dtype), names)
        return dict(zip(names, rounded))

    def publish(
        self,
        weights: Callable[[], dict[str, np.ndarray]],
        point: Callable[[common_pb2.WeightVersion], None],
        version: int,
        step: int,
    ) -> common_pb2.WeightVersion:
        """Write ``weights()`` (float32 arrays, HF names) as ``version`` and point the rollout
        workers at it (``point``: e.g. RunChannels.publish_weights)."""
        return self.publish_bits(self.snapshot(weights()), point, version, step)

    def publish_bits(
        self,
        bits: dict[str, np.ndarray],
        point: Callable[[common_pb2.WeightVersion], None],
        version: int,
        step: int,
    ) -> common_pb2.WeightVersion:
        """Write a ``snapshot`` as ``version`` (a keyframe or a delta against the last one)
        and point the workers at it. Thread-safe against the update; not against itself:
        one caller at a time (PublishThread)."""
        start = time.perf_counter()
        delta = self._delta_of(bits, version)
        last = self.last

        def serve(name: str):
            """One tensor's sha256 and (delta) its encoded change."""
            coded = codec.encode_tensor(last.bits[name], bits[name]) if delta else None
            return bits[name], codec.tensor_sha256(bits[name]), coded

        done = dict(zip(bits, codec.parallel_map(serve, bits)))  # tensor by tensor, threaded
        staging = self.store.staging_dir(version)
        changed = sum(b.size for b in bits.values())
        if delta:
            payload, changed = codec.delta_file({n: c for n, (_, _, c) in done.items()})
            (staging / codec.DELTA_FILE).write_bytes(payload)
        else:
            codec.write_keyframe(staging / codec.KEYFRAME_FILE, bits, self.dtype)
        serving = self._serving(version, delta, done, changed)
        pointer = self.store.commit(
            version,
            staging,
            kind="delta" if delta else "full",
            base_version=last.version if delta else 0,
            meta={"step": step},
            serving=serving,
        )
        point(pointer)
        self.last = _Published(version, pointer.sha256, serving["keyframe"], bits)
        log.info(
            "published weight version %d (%s %s, %.2f MB, %.4f of elements changed) in %.2fs",
            version,
            self.dtype,
            pointer.kind,
            pointer.bytes / 1e6,
            changed / max(serving["elements"], 1),
            time.perf_counter() - start,
        )
        return pointer

    def _delta_of(self, bits: dict[str, np.ndarray], version: int) -> bool:
        """Whether ``version`` goes out as a delta against the last one: it follows it, its
        keyframe is recent enough and every tensor has the same name and shape."""
        last = self.last
        return (
            last is not None
            and last.version == version - 1
            and version - last.keyframe < self.keyframe_every
            and last.bits.keys() == bits.keys()
            and all(last.bits[n].shape == a.shape for n, a in bits.items())
        )

    def _serving(self, version: int, delta: bool, done: dict, changed: int) -> dict:
        """The manifest's ``serving`` section (docs/weights.md): the chain's keyframe, the base
        version and its manifest hash, and every reconstructed tensor's sha256 and shape."""
        last = self.last
        return {
            "dtype": self.dtype,
            "keyframe": last.keyframe if delta else version,
            "base_version": last.version if delta else -1,
            "base_sha256": last.sha256 if delta else "",
            "elements": sum(b.size for b, _, _ in done.values()),
            "changed": changed,
            "tensors": {
                n: {"sha256": sha, "shape": list(b.shape)} for n, (b, sha, _) in done.items()
            },
        }


class PublishThread:
    """Runs ``send(version, step, bits)`` on one background thread, so that encoding, hashing,
    writing a version and pointing the workers at it overlap the learner's next wait and
    update instead of lengthening its step. At most one version is in flight: ``submit``
    first waits for the previous one, so versions reach the workers in order. An error in the
    thread is logged at once and raised by the next ``submit`` or ``join``.
    ``background=False`` sends in the caller (tests that step versions exactly);
    ``on_thread_start`` runs first on the thread (CoreBorrowing.roam: where it may run)."""

    def __init__(
        self,
        send: Callable[[int, int, dict], None],
        background: bool = True,
        on_thread_start: Callable[[], None] | None = None,
    ):
        self.send = send
        self.sent_s = 0.0  # how long the last finished send took, wherever it ran
        self._pool = (
            ThreadPoolExecutor(1, "weight-publish", initializer=on_thread_start)
            if background
            else None
        )
        self._inflight: Future | None = None

    def submit(self, version: int, step: int, bits: dict[str, np.ndarray]) -> float:
        """Start sending ``version``; returns the seconds spent waiting for the previous one."""
        waited = self.join()
        if self._pool is None:
            self._timed(version, step, bits)
        else:
            self._inflight = self._pool.submit(self._timed, version, step, bits)
        return waited

    def join(self) -> float:
        """Wait until the version in flight is out (raising its error); returns the wait."""
        start = time.perf_counter()
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()
        return time.perf_counter() - start

    def abandon(self) -> None:
        """On a failing run: wait for the version in flight, logging (not raising) its error,
        so that nothing is written or pointed to after the run has ended."""
        try:
            self.close()
        except Exception:  # the run's own error is the one to report
            log.exception("publishing the last weight version failed")

    def close(self) -> None:
        """Wait for the version in flight (raising its error), then stop the thread."""
        try:
            self.join()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def _timed(self, version: int, step: int, bits: dict[str, np.ndarray]) -> None:
        start = time.perf_counter()
        try:
            self.send(version, step, bits)
        except Exception:
            log.exception("publishing weight version %d failed", version)  # seen at once
            raise
        self.sent_s = time.perf_counter() - start


_WEIGHT_FILES = {"config.json", "generation_config.json", "model.safetensors.index.json"}


def export_final(model, source_dir: str, out: Path) -> Path:
    """The run's final policy in Hugging Face format. Tokenizer files (and any other metadata)
    are copied byte for byte from the initial model's directory: re-saving through
    AutoTokenizer could substitute the architecture's default tokenizer class."""
    model.save_pretrained(out, safe_serialization=True)
    for f in Path(source_dir).iterdir():
        if f.is_file() and f.suffix not in (".safetensors", ".bin") and f.name not in _WEIGHT_FILES:
            shutil.copy2(f, out / f.name)
    return out
