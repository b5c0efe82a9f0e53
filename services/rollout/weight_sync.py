"""Keeping a worker's engine on the newest published weight version (docs/weights.md).

``WeightSync.sync(run_id, pointer)`` runs between jobs:

1. fetch (a background thread): verify the pointer's version and plan its chain — the deltas
   after the version the engine holds, or the chain's keyframe and every delta after it
   (brorl.weights.chain) — reading and hash-checking every file of it. A fetch still running
   after ``deadline_s`` is reported (log + ``rollout/weights_fetch_stalls``) and the worker
   goes on serving the version it has; the fetch is picked up when it ends.
2. apply (under the engine lock): the engine applies the verified versions to its serving state,
   checks every reconstructed tensor's sha256 and serves the result.

A missing or corrupt version is rejected (log + ``rollout/weights_rejected``) and remembered:
the worker serves the last version it could verify and waits for the next keyframe. A
reconstruction whose hashes do not match is rejected and rebuilt from the keyframe, checking
every step (``rollout/weights_fallbacks``). A version without a serving section (a Hugging
Face directory) loads through ``engine.load_weights``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from brorl.v1 import common_pb2
from brorl.weights.store import MANIFEST
from brorl.weights.chain import ChainError, Held, Step, plan_chain, read_step, verified_steps
from services.rollout.engine import EngineLock

log = logging.getLogger(__name__)


@dataclass
class _Fetch:
    """One fetch in flight: its thread, when it started, and what it found."""

    pointer: common_pb2.WeightVersion
    run_id: str
    careful: bool
    started: float = field(default_factory=time.perf_counter)
    thread: threading.Thread | None = None
    steps: list[Step] = field(default_factory=list)
    error: ChainError | None = None
    hf_dir: str = ""  # a version that is a plain Hugging Face directory
    reported: bool = False


class WeightSync:
    def __init__(self, engine, lock: EngineLock, deadline_s: float = 60.0):
        self.engine, self.lock, self.deadline_s = engine, lock, deadline_s
        self.held = Held()  # what the engine's serving state holds
        self.loaded_run = ""  # the run whose published weights the engine serves
        self.counts: Counter = Counter()  # rollout/weights_* counters
        self._fetch: _Fetch | None = None
        self._bad: set[tuple[str, int]] = set()  # (run, version) rejected: never retried
        self._tried: tuple = ()  # the last pointer a sync could not fully reach

    def current(self, run_id: str, pointer: common_pb2.WeightVersion) -> bool:
        """True when there is nothing to do for ``pointer``."""
        if run_id == self.loaded_run and pointer.version <= self.engine.weight_version:
            return True
        return self._tried == (run_id, pointer.version, pointer.sha256)

    def sync(self, run_id: str, pointer: common_pb2.WeightVersion) -> bool:
        """Bring the engine to ``pointer``'s version as far as verification allows, waiting at
        most ``deadline_s`` for the fetch. True when the engine serves a new version."""
        job = self._fetch
        if job is None:
            if self.current(run_id, pointer):
                return False
            job = self._start(pointer, run_id, careful=False)
        job.thread.join(timeout=max(self.deadline_s - (time.perf_counter() - job.started), 0.0))
        if job.thread.is_alive():
            if not job.reported:
                job.reported = True
                self.counts["rollout/weights_fetch_stalls"] += 1
                log.warning(
                    "fetching weight version %d has taken over %.1fs (deadline); still serving "
                    "version %d",
                    job.pointer.version,
                    self.deadline_s,
                    self.engine.weight_version,
                )
            return False
        self._fetch = None
        return self._apply(job)

    def _start(self, pointer, run_id: str, careful: bool) -> _Fetch:
        job = _Fetch(pointer, run_id, careful)
        held = Held() if careful else self.held
        job.thread = threading.Thread(
            target=self._run_fetch, args=(job, held), name="weight-fetch", daemon=True
        )
        self._fetch = job
        job.thread.start()
        return job

    def _run_fetch(self, job: _Fetch, held: Held) -> None:
        pointer, path = job.pointer, Path(job.pointer.uri)
        broken = None
        try:
            newest = read_step(path, pointer.version, pointer.sha256, serving=False)
        except ChainError as exc:  # its manifest may still be sound: reach the version before
            broken, newest = exc, _authentic_manifest(path, pointer)
            if newest is None or "serving" not in newest.manifest:
                job.error = exc
                return
        if "serving" not in newest.manifest:
            job.hf_dir = str(path)
            return
        versions = plan_chain(newest, held, job.run_id)
        if broken is not None:
            versions = versions[:-1]
        for i, u in enumerate(versions):
            if (job.run_id, u) in self._bad:  # rejected before: wait for a newer keyframe
                versions = versions[:i]
                break
        job.steps, job.error = verified_steps(newest, versions, held.sha256)
        job.error = job.error or broken

    def _apply(self, job: _Fetch) -> bool:
        before = (self.loaded_run, self.engine.weight_version)
        target = (job.run_id, job.pointer.version, job.pointer.sha256)
        if job.error is not None:
            self._reject(job.run_id, job.error, remember=True)
        start = time.perf_counter()
        if job.hf_dir:
            with self.lock:
                self.engine.load_weights(job.hf_dir, job.pointer.version)
            self.held, self.loaded_run = Held(), job.run_id
        elif job.steps:
            with self.lock:
                result = self.engine.apply_weight_chain(job.steps, job.run_id, job.careful)
            self.held = result.held
            if result.loaded.version >= 0:
                self.loaded_run = result.loaded.run_id
            if result.error is not None:
                error = ChainError(result.error["version"], result.error["reason"])
                self._reject(job.run_id, error, remember=job.careful)
                if not job.careful:  # rebuild from the keyframe, every step checked
                    self.counts["rollout/weights_fallbacks"] += 1
                    self._start(job.pointer, job.run_id, careful=True)
                    return self.sync(job.run_id, job.pointer) or self._changed(before)
        seconds = time.perf_counter() - start
        if seconds > self.deadline_s:
            self.counts["rollout/weights_apply_stalls"] += 1
            log.warning("applying weight version %d took %.0fs", job.pointer.version, seconds)
        reached = self.loaded_run == job.run_id and self.engine.weight_version >= target[1]
        self._tried = () if reached else target
        return self._changed(before)

    def _changed(self, before: tuple) -> bool:
        return (self.loaded_run, self.engine.weight_version) != before

    def _reject(self, run_id: str, error: ChainError, remember: bool) -> None:
        self.counts["rollout/weights_rejected"] += 1
        if remember:
            self._bad.add((run_id, error.version))
        log.warning("rejected %s; serving version %d", error, self.engine.weight_version)


def _authentic_manifest(path: Path, pointer) -> Step | None:
    """The newest version's manifest when it matches the pointer's sha256 (its files may not)."""
    try:
        raw = (path / MANIFEST).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(raw).hexdigest() != pointer.sha256:
        return None
    return Step(pointer.version, str(path), json.loads(raw), pointer.sha256)
