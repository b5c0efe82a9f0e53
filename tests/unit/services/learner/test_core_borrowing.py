"""The learner's update borrows the rollout workers' cores while they have nothing to sample
(services/learner/cores.py): every thread of the process allowed on its own cores plus the
borrowed ones, one more torch thread each, and back — the extra OpenMP threads included — as
soon as a job waits or the update ends. The switching runs in a child process pinned to one core
(it moves every thread of its process); the launcher's rule is brorl/apps/cluster/placement.py's
``borrowable``; the prompt backlog it asks is tested against the real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from brorl.queue import RunChannels, connect
from services.learner.config import LearnerServiceConfig
from services.learner.cores import CoreBorrowing

USABLE = sorted(os.sched_getaffinity(0))
# run_child's scripts start so: the learner's own core and one to borrow from argv, one torch
# thread, and a backlog the script sets (busy[0]).
SETUP = r"""
import json, os, sys, threading, time
import torch
from services.learner.cores import CoreBorrowing

own, borrow = int(sys.argv[1]), int(sys.argv[2])
os.sched_setaffinity(0, {own})
torch.set_num_threads(1)
busy = [True]
cores = CoreBorrowing([borrow, own], lambda: busy[0], min_interval_s=0.0)
"""
CHILD = r"""
a = torch.randn(256, 256)

def seen():
    allowed = set()
    for tid in os.listdir("/proc/self/task"):
        allowed |= os.sched_getaffinity(int(tid))
    return {"threads": torch.get_num_threads(), "cores": sorted(allowed), "wide": cores.wide}

out = {}
cores.refresh(); a @ a; out["busy"] = seen()
busy[0] = False
cores.refresh(); a @ a; time.sleep(0.05); out["idle"] = seen()
busy[0] = True
cores.refresh(); out["busy_again"] = seen()
busy[0] = False
cores.refresh(); a @ a; cores.release(); out["released"] = seen()
out["seconds"] = cores.take_seconds()
out["seconds_after"] = cores.take_seconds()
print(json.dumps(out))
"""


def run_child(script: str, own: int, borrow: int) -> dict:
    """SETUP then ``script`` in a child process (it moves every thread of its process) given the
    learner's own core and the one to borrow; its last line of output, read as JSON."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", SETUP + script, str(own), str(borrow)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable cores")
def test_threads_widen_to_the_borrowed_core_while_idle_and_come_back():
    own, borrow = USABLE[-1], USABLE[0]
    seen = run_child(CHILD, own, borrow)
    assert seen["busy"] == {"threads": 1, "cores": [own], "wide": False}
    assert seen["idle"] == {"threads": 2, "cores": sorted({own, borrow}), "wide": True}
    # narrowed: the OpenMP thread started while wide is pinned back too
    assert seen["busy_again"] == {"threads": 1, "cores": [own], "wide": False}
    assert seen["released"] == {"threads": 1, "cores": [own], "wide": False}
    assert seen["seconds"] >= 0.05 and seen["seconds_after"] == 0.0


ROAMING = r"""
ready, done, tid = threading.Event(), threading.Event(), []

def publisher():  # as the weight-publish thread starts (PublishThread's on_thread_start)
    cores.roam()
    tid.append(threading.get_native_id())
    ready.set()
    done.wait(30)

t = threading.Thread(target=publisher)
t.start()
ready.wait(30)
busy[0] = False
cores.refresh()  # idle workers: wide
busy[0] = True
cores.refresh()  # a job: every thread back on the learner's core, but the roaming one
cores.release()
out = {"roaming": sorted(os.sched_getaffinity(tid[0])), "main": sorted(os.sched_getaffinity(0))}
done.set()
t.join()
print(json.dumps(out))
"""


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable cores")
def test_a_roaming_thread_keeps_every_core_when_the_update_is_pinned_back():
    own, borrow = USABLE[-1], USABLE[0]
    seen = run_child(ROAMING, own, borrow)
    assert seen == {"roaming": sorted({own, borrow}), "main": [own]}


def test_with_nothing_to_borrow_a_thread_does_not_roam():
    cores = CoreBorrowing([3], lambda: False, own={3})
    before = os.sched_getaffinity(0)
    cores.roam()
    assert os.sched_getaffinity(0) == before


def test_nothing_to_borrow_never_asks_the_backlog():
    def never():
        raise AssertionError("asked")

    cores = CoreBorrowing([3], never, own={3})  # the learner's own core only
    assert not cores.enabled
    cores.refresh()
    cores.release()
    assert cores.take_seconds() == 0.0


def test_a_failing_backlog_read_keeps_the_update_on_its_own_cores(caplog):
    def down():
        raise ConnectionError("redis down")

    cores = CoreBorrowing([0], down, own={1}, threads=1, min_interval_s=0.0)
    cores.refresh()
    cores.refresh()
    assert not cores.wide and caplog.text.count("not borrowing") == 1


def test_borrowing_needs_one_rank_and_real_cores():
    assert LearnerServiceConfig(borrow_cores=[0]).borrow_cores == [0]
    with pytest.raises(ValueError, match="ranks: 1"):
        LearnerServiceConfig(borrow_cores=[0], ranks=2)
    with pytest.raises(ValueError, match=">= 0"):
        LearnerServiceConfig(borrow_cores=[-1])


@pytest.mark.redis
def test_the_prompt_backlog_counts_waiting_and_claimed_jobs():
    client = connect("redis://127.0.0.1:6379/0")
    channels = RunChannels(client, f"test-backlog-{uuid.uuid4().hex[:16]}", namespace="test")
    try:
        jobs = channels.prompt_queue()
        assert channels.prompt_backlog() == 0  # no stream yet
        for i in range(3):
            jobs.put(f"job{i}".encode())
        assert channels.prompt_backlog() == 3
        worker = channels.prompt_queue(consumer="w")
        [first, second] = worker.read(count=2, block_ms=100)
        assert channels.prompt_backlog() == 3  # two being sampled, one waiting
        worker.ack(first.entry_id)
        assert channels.prompt_backlog() == 2
        worker.ack(second.entry_id)
        [third] = worker.read(count=5, block_ms=100)
        worker.ack(third.entry_id)
        assert channels.prompt_backlog() == 0
    finally:
        for key in channels.keys.values():
            client.delete(key)
