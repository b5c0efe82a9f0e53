"""Where the worker runs an engine call's tail: selecting, scoring and publishing its groups.

After the engine has sampled a call, what is left of it is mostly waiting: on the reward
service (ScoreBatch) and on Redis (the publish-and-ack script), with some Python (selection
statistics, building the paths) between. Run in the worker's loop it holds the engine idle for
that time (≈ 10-15% of a demo_fast call on 2 cores); run on ``TailThread`` it overlaps the
next call's sampling, whose model runs in torch and releases the GIL.

At most one tail runs beside a call: ``run`` waits for the previous tail before it queues the
next, so a slow reward service slows the loop instead of piling up sampled calls, and a tail's
error is raised in the loop at the next hand-off (after the new tail is queued: what was
sampled is never dropped for an earlier call's failure). ``Inline`` is the same contract with no
thread: a test drives ``RolloutWorker.step`` and sees the call published when it returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

Tail = Callable[[], None]


def _run(tail: Tail, then: Tail) -> None:
    try:
        tail()
    finally:
        then()


class Inline:
    """Runs each tail at once, in the caller's thread."""

    waited_s = 0.0  # never waits for an earlier tail

    def run(self, tail: Tail, then: Tail) -> None:
        """``tail()``, then ``then()`` even when the tail failed (e.g. end a lease)."""
        _run(tail, then)

    def close(self) -> None:
        pass


class TailThread:
    """One thread that runs the tails it is handed, one at a time, in their order."""

    def __init__(self, name: str = "rollout-tail"):
        self._todo: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._done.set()
        self._error: BaseException | None = None
        self.waited_s = 0.0  # seconds ``run`` spent waiting for an earlier tail (cumulative)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def run(self, tail: Tail, then: Tail) -> None:
        """Queue ``tail`` (and ``then`` after it, failed or not) once the previous tail is done;
        raise the previous tail's error, if any, after queueing this one."""
        start = time.perf_counter()
        self._done.wait()
        self.waited_s += time.perf_counter() - start
        error, self._error = self._error, None
        self._done.clear()
        self._todo.put((tail, then))
        if error is not None:
            raise error

    def close(self) -> None:
        """Finish the queued tail, stop the thread; its error, if any, is logged."""
        self._done.wait()
        self._todo.put(None)
        self._thread.join()
        if self._error is not None:
            log.error("the last tail failed", exc_info=self._error)

    def _loop(self) -> None:
        while (item := self._todo.get()) is not None:
            try:
                _run(*item)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop at the next run()
                self._error = exc
            finally:
                self._done.set()
