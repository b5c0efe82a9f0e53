"""Which cores each rollout worker's vLLM engine is pinned to (docs/performance.md)."""

from __future__ import annotations

import os

import pytest

from brorl.apps.cluster.launcher import worker_cpu_bind
from services.rollout.config import EngineConfig


def test_spread_gives_worker_i_the_ith_usable_core_round_robin(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 1})
    assert [worker_cpu_bind("spread", i) for i in range(3)] == ["1", "3", "1"]


@pytest.mark.parametrize("mode", ["auto", "nobind", "0-1"])
def test_other_modes_reach_every_worker_as_given(mode):
    assert {worker_cpu_bind(mode, i) for i in range(4)} == {mode}


def test_the_engine_takes_a_core_number_from_the_command_line_as_text():
    assert EngineConfig(cpu_threads_bind=1).cpu_threads_bind == "1"
    with pytest.raises(ValueError):
        EngineConfig(cpu_threads_bind="all of them")
