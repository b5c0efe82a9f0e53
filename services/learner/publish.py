"""Publishing weight versions (keyframes and deltas in the weight store + Redis pointer) and
the final HF export."""

from __future__ import annotations

import logging
import shutil
import time
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

    def publish(
        self,
        weights: Callable[[], dict[str, np.ndarray]],
        point: Callable[[common_pb2.WeightVersion], None],
        version: int,
        step: int,
    ) -> common_pb2.WeightVersion:
        """Write ``weights()`` (float32 arrays, HF names) as ``version`` and point the rollout
        workers at it (``point``: e.g. RunChannels.publish_weights)."""
        start = time.perf_counter()
        master = weights()
        delta = self._delta_of(master, version)
        last = self.last

        def serve(name: str):
            """One tensor's serving bits, their sha256 and (delta) their encoded change."""
            bits = codec.serving_bits(master[name], self.dtype)
            coded = codec.encode_tensor(last.bits[name], bits) if delta else None
            return bits, codec.tensor_sha256(bits), coded

        done = dict(zip(master, codec.parallel_map(serve, master)))  # tensor by tensor, threaded
        bits = {n: b for n, (b, _, _) in done.items()}
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

    def _delta_of(self, master: dict[str, np.ndarray], version: int) -> bool:
        """Whether ``version`` goes out as a delta against the last one: it follows it, its
        keyframe is recent enough and every tensor has the same name and shape."""
        last = self.last
        return (
            last is not None
            and last.version == version - 1
            and version - last.keyframe < self.keyframe_every
            and last.bits.keys() == master.keys()
            and all(last.bits[n].shape == a.shape for n, a in master.items())
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
