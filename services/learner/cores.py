"""The learner's update on the rollout workers' cores too, while they have nothing to sample.

On a small machine the local cluster pins the rollout workers to some cores and the learner to
the rest (brorl/apps/cluster/placement.py). When the learner is the slower stage (long
completions, a bigger model), the workers sample a step's groups in part of the learner's step and
then wait for the next jobs, which only the learner sends (its job feed tops up when it collects
groups, never during an update). From then to the end of the update their cores are idle, and
the learner may take them: this module widens the affinity of every thread of the learner's
process to its own cores plus ``borrow_cores`` and sets one torch thread per core; when the update
ends, or a check finds a job waiting or being sampled, it sets the threads back and pins every
thread (the extra OpenMP ones included, so none spins on a worker's core) to its own cores.

``busy`` tells whether the run has a job waiting or being sampled (RunChannels.prompt_backlog);
it is asked before each chunk of the update and between the model's layers
(model/layer_hooks.py), at most every ``min_interval_s``. A thread that ``roam``s (the
weight-publish thread) may run on both kinds of core all along.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import torch

log = logging.getLogger(__name__)


def pin_threads(cores: set[int], keep: set[int] | frozenset[int] = frozenset()) -> None:
    """Every thread of this process allowed on ``cores`` only, but those in ``keep`` (their
    thread ids), left where they are."""
    for tid in os.listdir("/proc/self/task"):
        if int(tid) in keep:
            continue
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # the thread ended meanwhile
            pass


class CoreBorrowing:
    def __init__(
        self,
        borrow: list[int],
        busy: Callable[[], bool],
        *,
        own: set[int] | None = None,
        threads: int | None = None,
        min_interval_s: float = 0.05,
    ):
        """``own``: this process's cores (default: its affinity now); ``threads``: its torch
        threads on them (default: torch's count now)."""
        self.own = set(own if own is not None else os.sched_getaffinity(0))
        self.borrow = set(borrow) - self.own
        self.busy, self.min_interval_s = busy, min_interval_s
        self.threads = threads or torch.get_num_threads()
        self.wide = False
        self.borrowed_s = 0.0  # seconds on the borrowed cores since the last ``take_seconds``
        self._since = 0.0  # when the threads went wide
        self._checked = -float("inf")
        self._warned = False
        self._roaming: set[int] = set()  # thread ids that ``roam``: never pinned back

    @property
    def enabled(self) -> bool:
        return bool(self.borrow)

    def refresh(self) -> None:
        """Before a chunk of the update: wide while the workers have nothing to sample."""
        now = time.perf_counter()
        if not self.enabled or now - self._checked < self.min_interval_s:
            return
        self._checked = now
        try:
            idle = not self.busy()
        except Exception:  # noqa: BLE001 - the update goes on, on the learner's own cores
            if not self._warned:  # once: the trainer's own Redis calls report an outage
                log.warning("could not read the prompt backlog; not borrowing", exc_info=True)
            self._warned, idle = True, False
        if idle != self.wide:
            self._set(idle)

    def release(self) -> None:
        """After the update (and when the run ends): the learner's own cores and threads."""
        if self.wide:
            self._set(False)
        self._checked = -float("inf")

    def roam(self) -> None:
        """Let the calling thread run on the learner's own cores and the borrowable ones alike,
        whatever the update's threads do, and leave the choice to the kernel. For the
        weight-publish thread: the version it sends is what the workers wait for, their cores
        idle, at the start of a learner-bound run's update; pinned to the learner's core it took
        turns with the update there (docs/performance.md, "The learner's core, thread by
        thread"). Nothing to borrow: nothing changes."""
        if not self.enabled:
            return
        try:
            os.sched_setaffinity(0, self.own | self.borrow)
        except OSError as e:  # cores this process may not use: it stays where it is
            log.warning("the thread stays on cores %s: %s", sorted(self.own), e)
            return
        self._roaming.add(threading.get_native_id())

    def take_seconds(self) -> float:
        """Seconds on the borrowed cores since the last call (the current stretch included)."""
        if self.wide:
            now = time.perf_counter()
            self.borrowed_s += now - self._since
            self._since = now
        out, self.borrowed_s = self.borrowed_s, 0.0
        return out

    def _set(self, wide: bool) -> None:
        # widen the affinity before the new threads start (they inherit it); narrow it after
        # the extra threads went idle, and for all of them
        if wide:
            pin_threads(self.own | self.borrow)
            torch.set_num_threads(self.threads + len(self.borrow))
            self._since = time.perf_counter()
        else:
            torch.set_num_threads(self.threads)
            pin_threads(self.own, keep=self._roaming)
            self.borrowed_s += time.perf_counter() - self._since
        self.wide = wide
