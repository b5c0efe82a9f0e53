"""Keeping a worker's engine on the newest published weight version (docs/weights.md).

``WeightSync.sync(run_id, pointer)`` runs between jobs:

1. fetch (a background thread): verify the pointer's version and plan its chain — the deltas
   after the version the engine holds, or the chain's keyframe and every delta after it
   (brorl.weights.chain) — reading and hash-checking every file of it. A fetch still running
   after ``deadline_s`` is reported (log + ``rollout/weights_fetch_stalls``) and the worker
   goes on serving the version it has; the fetch is picked up when it ends.
2. apply: the engine applies the verified versions to its serving state, checks every
   reconstructed tensor's sha256 and serves the result. An engine that ``stages_weights`` does
   all but the last part on the fetch's thread, beside a running call (its serving state
   advanced, the model's next weights prepared), and only swaps them in under the engine lock;
   other engines do it all under the lock.

``prefetch(run_id, pointer)`` starts step 1 (and the staging) without waiting: the worker calls
it from a thread that listens to the run's announced pointers while the engine samples
(``weight_watch``), so that the sync before the next call finds the version ready to swap in.
The fetch's thread may run on ``background_cores`` as well as the process's own: there it takes
no time from the engine.

A missing or corrupt version is rejected (log + ``rollout/weights_rejected``) and remembered:
the worker serves the last version it could verify and waits for the next keyframe. A
reconstruction whose hashes do not match is rejected and rebuilt from the keyframe, checking
every step (``rollout/weights_fallbacks``). A version without a serving section (a Hugging
Face directory) loads through ``engine.load_weights``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from brorl.v1 import common_pb2
from brorl.weights.store import MANIFEST
from brorl.weights.chain import (
    ChainError,
    ChainResult,
    Held,
    Step,
    plan_chain,
    read_step,
    verified_steps,
)
from services.rollout.engine import EngineLock

log = logging.getLogger(__name__)
WATCH_IDLE_S = 0.2  # the watch's longest wait before it checks the run it follows again


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
    staged: ChainResult | None = None  # an engine that stages_weights: what it staged
    failure: BaseException | None = None  # an unexpected error of the thread, raised by sync
    hf_dir: str = ""  # a version that is a plain Hugging Face directory
    reported: bool = False


class WeightSync:
    def __init__(
        self,
        engine,
        lock: EngineLock,
        deadline_s: float = 60.0,
        background_cores: Iterable[int] = (),
    ):
        self.engine, self.lock, self.deadline_s = engine, lock, deadline_s
        self.background_cores = set(background_cores)
        self._mu = threading.Lock()  # the fetch in flight: started by sync or prefetch
        self._applying = False
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

    def prefetch(self, run_id: str, pointer: common_pb2.WeightVersion) -> None:
        """Start fetching (and staging) ``pointer``'s version unless a fetch is in flight or
        being applied, or there is nothing to do; never waits."""
        with self._mu:
            if self._fetch is None and not self._applying and not self.current(run_id, pointer):
                self._start(pointer, run_id, careful=False)

    def sync(self, run_id: str, pointer: common_pb2.WeightVersion) -> bool:
        """Bring the engine to ``pointer``'s version as far as verification allows, waiting at
        most ``deadline_s`` for a fetch. True when the engine serves a new version. A fetch
        started earlier (a prefetch, a stalled fetch) is applied first; when it was for another
        run or an older version, the one asked for is fetched and applied after it: the next
        call never samples a run's jobs with another run's weights, nor with an older version
        than the pointer read before it."""
        changed = False
        while True:
            with self._mu:
                job = self._fetch
                if job is None:
                    if self.current(run_id, pointer):
                        return changed
                    job = self._start(pointer, run_id, careful=False)
            if not self._finished(job):
                return changed
            with self._mu:
                self._fetch, self._applying = None, True
            try:
                changed = self._apply(job) or changed
            finally:
                self._applying = False
            if job.run_id == run_id and job.pointer.version >= pointer.version:
                return changed

    def _finished(self, job: _Fetch) -> bool:
        """Wait for ``job`` until the deadline; a fetch still running then is reported once."""
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
        return True

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
        if self.background_cores:
            try:  # this thread only (pid 0): the engine's cores and the background ones
                os.sched_setaffinity(0, os.sched_getaffinity(0) | self.background_cores)
            except OSError as exc:
                log.debug("weight fetch stays on its process's cores: %s", exc)
        try:
            self._fetch_and_stage(job, held)
        except Exception as exc:  # noqa: BLE001 - raised by sync, in the worker's loop
            job.failure = exc

    def _fetch_and_stage(self, job: _Fetch, held: Held) -> None:
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
        if job.steps and getattr(self.engine, "stages_weights", False):
            job.staged = self.engine.stage_weight_chain(job.steps, job.run_id, job.careful)

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
        elif job.failure is not None:
            raise job.failure
        elif job.steps:
            with self.lock:
                if job.staged is None:
                    result = self.engine.apply_weight_chain(job.steps, job.run_id, job.careful)
                else:
                    result = dataclasses.replace(job.staged, loaded=self.engine.swap_staged())
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


@contextlib.contextmanager
def weight_watch(sync: WeightSync, followed: Callable[[], tuple[str, Any]], enabled: bool = True):
    """While the block runs, a thread listens to the announced weight pointers of the run
    ``followed`` names ((run id, its RunChannels or None)) and fetches and stages each at once
    (``prefetch``), not at the next call. It waits on the announcements' socket (no Redis call
    and no GIL while nothing is published). ``enabled`` False: no thread."""
    done = threading.Event()

    def watch() -> None:
        run_id, sub = "", None
        while not done.is_set():
            try:
                now, channels = followed()
                if sub is None or now != run_id:
                    if sub is not None:
                        sub.close()
                    run_id, sub = now, channels.weight_announcements() if channels else None
                if sub is None:
                    done.wait(WATCH_IDLE_S)
                elif (pointer := sub.next(WATCH_IDLE_S)) is not None:
                    sync.prefetch(run_id, pointer)
            except Exception:  # noqa: BLE001 - the loop's own sync still reaches every version
                log.debug("weights watch: listening again in 1 s", exc_info=True)
                sub = _closed(sub)
                done.wait(1.0)
        _closed(sub)

    thread = threading.Thread(target=watch, name="weights-watch", daemon=True)
    if enabled:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread.is_alive():
            thread.join()


def _closed(sub) -> None:
    try:
        if sub is not None:
            sub.close()
    except Exception:  # noqa: BLE001 - a broken connection is dropped either way
        log.debug("weights watch: closing the subscription failed", exc_info=True)


def _authentic_manifest(path: Path, pointer) -> Step | None:
    """The newest version's manifest when it matches the pointer's sha256 (its files may not)."""
    try:
        raw = (path / MANIFEST).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(raw).hexdigest() != pointer.sha256:
        return None
    return Step(pointer.version, str(path), json.loads(raw), pointer.sha256)
