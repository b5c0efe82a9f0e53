"""Background work below the rest on its core (brorl/priority.py): the process's nice value and,
for a session's leader, its autogroup's, read back from the kernel; never the caller's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from brorl import priority

REPO = Path(__file__).resolve().parents[3]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def sleeper(**kw) -> subprocess.Popen:
    return subprocess.Popen(SLEEPER, **kw)


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def test_a_session_leader_is_lowered_with_its_autogroup():
    ours = priority.autogroup_nice(os.getpid())
    proc = sleeper(start_new_session=True)
    try:
        assert priority.lower(proc.pid, 7)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 7
        if priority.autogroups_on():  # this machine kind's default
            assert priority.autogroup_nice(proc.pid) == 7
    finally:
        stop(proc)
    assert priority.autogroup_nice(os.getpid()) == ours


def test_a_process_in_the_callers_session_leaves_the_shared_autogroup_alone():
    ours = priority.autogroup_nice(os.getpid())
    proc = sleeper()
    try:
        assert priority.lower(proc.pid, 5)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 5
        assert priority.autogroup_nice(proc.pid) == ours  # the group it shares with us
    finally:
        stop(proc)


def test_a_child_takes_a_session_of_its_own_before_it_lowers_itself():
    code = (
        "import json, os\n"
        "from brorl import priority\n"
        "took = priority.own_session_below(11)\n"
        "print(json.dumps([took, os.getsid(0) == os.getpid(), os.getpriority(os.PRIO_PROCESS, 0),"
        " priority.autogroup_nice(os.getpid())]))\n"
    )
    ours = priority.autogroup_nice(os.getpid())
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    took, leads, nice, group = json.loads(out.stdout)
    assert took and leads and nice == 11
    if priority.autogroups_on():
        assert group == 11
    assert priority.autogroup_nice(os.getpid()) == ours


def test_zero_changes_nothing_and_bad_values_are_refused():
    proc = sleeper(start_new_session=True)
    try:
        assert priority.lower(proc.pid, 0)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        with pytest.raises(ValueError, match="outside 0-19"):
            priority.lower(proc.pid, 20)
    finally:
        stop(proc)
    with pytest.raises(ValueError, match="no process 0"):
        priority.lower(0, 19)  # setpriority's 0 would be the caller


def test_a_process_that_is_gone_is_a_warning_not_an_error(caplog):
    proc = sleeper()
    stop(proc)
    assert not priority.lower(proc.pid, 19)
    assert f"could not lower process {proc.pid}" in caplog.text
