"""The learner's per-thread clock (services/learner/observe/thread_clock.py): the kernel's
scheduler statistics read as seconds running and seconds waiting runnable for a core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from services.learner.observe.thread_clock import (
    SCHEDSTAT,
    ThreadClock,
    parse_schedstat,
    thread_times,
)


def test_schedstat_fields_are_running_then_runnable_nanoseconds():
    times = parse_schedstat("1250000000 40000000 17\n")
    assert times.running_s == pytest.approx(1.25)
    assert times.runnable_s == pytest.approx(0.04)


def test_an_unreadable_or_short_schedstat_gives_none(tmp_path):
    assert thread_times(tmp_path / "missing") is None
    (tmp_path / "short").write_text("12\n")
    assert thread_times(tmp_path / "short") is None
    clock = ThreadClock(tmp_path / "missing")
    clock.start()
    assert clock.stop() is None


# A busy thread beside a busy process on one core: each runs about half the time and waits
# runnable the rest. (A rival thread of the same process would not do: the two would take turns
# holding the GIL, and a thread waiting for the GIL sleeps, it is not runnable.)
SHARED_CORE = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from services.learner.observe.thread_clock import ThreadClock
    core = {min(os.sched_getaffinity(0))}
    os.sched_setaffinity(0, core)
    def spin_for(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    clock = ThreadClock()
    clock.start()
    cpu = time.thread_time()
    while time.thread_time() - cpu < 0.3:  # 0.3 s of this thread's CPU, however busy the core
        pass
    alone, cpu = clock.stop(), time.thread_time() - cpu
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # inherits the core
    try:
        time.sleep(0.2)  # the rival is up and spinning
        clock.start()
        start = time.perf_counter()
        spin_for(1.2)  # beside it
        shared, wall = clock.stop(), time.perf_counter() - start
    finally:
        rival.kill()
        rival.wait()
    print(json.dumps({"wall": wall, "running": shared.running_s, "runnable": shared.runnable_s,
                      "alone_running": alone.running_s, "cpu": cpu}))
    """
)


@pytest.mark.skipif(not SCHEDSTAT.exists(), reason="the kernel reports no per-thread schedstat")
def test_a_thread_sharing_its_core_waits_runnable_for_part_of_its_time():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", SHARED_CORE], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # its time on a core is the thread's CPU time (the suite's other lane may share the core)
    assert got["alone_running"] == pytest.approx(got["cpu"], rel=0.1)
    # beside a busy process on its core it waits a good part of its wall time, and its wall
    # time is spent either running or waiting for the core: it never sleeps
    assert got["runnable"] > 0.25 * got["wall"]
    assert got["running"] + got["runnable"] == pytest.approx(got["wall"], rel=0.15)
