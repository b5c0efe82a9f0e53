"""The calling thread's own clock, from the kernel's scheduler statistics: the seconds it ran
on a core and the seconds it was ready to run but waited for one.

On a small machine the learner shares its core with other processes (a rollout worker's tail,
the reward service) and with its own publish thread. Its update then takes longer than the same
update alone although nothing in it got slower: the extra time is spent runnable, waiting for the
core. ``learner/update_runnable_s`` (the trainer's metric) tells that apart from a slower update;
bench/e2e.py reports its share of the update (docs/performance.md).

Linux only (``/proc/thread-self/schedstat``: nanoseconds on the CPU, nanoseconds waiting on a run
queue, time slices); elsewhere, or where the kernel keeps no such statistics, ``thread_times``
returns None and the trainer leaves the metrics out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SCHEDSTAT = Path("/proc/thread-self/schedstat")


@dataclass(frozen=True)
class ThreadTimes:
    running_s: float  # on a CPU since the thread started
    runnable_s: float  # ready to run, waiting on a run queue for a core, since it started

    def __sub__(self, earlier: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.running_s - earlier.running_s, self.runnable_s - earlier.runnable_s)


def parse_schedstat(text: str) -> ThreadTimes:
    """``"<ns on cpu> <ns runnable> <slices>"`` (proc(5), /proc/pid/schedstat) as seconds."""
    fields = text.split()
    if len(fields) < 2:
        raise ValueError(f"schedstat has {len(fields)} fields, expected 3: {text!r}")
    return ThreadTimes(int(fields[0]) / 1e9, int(fields[1]) / 1e9)


def thread_times(path: Path = SCHEDSTAT) -> ThreadTimes | None:
    """The calling thread's times now, or None where the kernel does not report them."""
    try:
        return parse_schedstat(path.read_text())
    except (OSError, ValueError):
        return None


class ThreadClock:
    """Times one stretch of the calling thread: ``start()`` then ``stop()``, which returns the
    stretch's ``ThreadTimes`` (None where they are not available). Call both on one thread."""

    def __init__(self, path: Path = SCHEDSTAT):
        self.path = path
        self._start: ThreadTimes | None = None

    def start(self) -> None:
        self._start = thread_times(self.path)

    def stop(self) -> ThreadTimes | None:
        end = thread_times(self.path)
        if end is None or self._start is None:
            return None
        return end - self._start
