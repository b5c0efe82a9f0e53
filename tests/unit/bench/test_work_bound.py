"""bench/pipeline/bound.py: the most two stages can make of a machine's cores, and the cores a
stage ran on."""

from __future__ import annotations

import pytest

from bench.pipeline.bound import core_seconds_per_path, stage_cores, work_bound


def test_the_bound_adds_the_core_seconds_a_path_costs_each_stage():
    # the long shape on an AVX2 EPYC: rollout alone 10.3 paths/s on one core, learner 4.19 on one
    assert work_bound(2, 1, 10.3, 1, 4.19) == pytest.approx(2 / (1 / 10.3 + 1 / 4.19))
    # irregular: 3 cores, the rollout alone 700 paths/s on 2 of them, the learner 450 on 1
    per_path = 2 / 700 + 1 / 450
    assert work_bound(3, 2, 700.0, 1, 450.0) == pytest.approx(3 / per_path)
    # two equal stages on one core each: together they make what each makes alone
    assert work_bound(2, 1, 5.0, 1, 5.0) == pytest.approx(5.0)


def test_on_one_core_each_the_bound_lies_between_the_slower_and_the_faster_stage():
    # two cores shared with no loss beat a pipeline at the slower stage's pace on its own core,
    # and cannot beat the faster stage (it has to leave the slower one some core-time)
    for rollout, learner in [(10.3, 4.19), (989.0, 1839.0), (1.0, 1000.0), (7.0, 7.0)]:
        bound = work_bound(2, 1, rollout, 1, learner)
        assert min(rollout, learner) <= bound * (1 + 1e-12)
        assert bound <= max(rollout, learner) * (1 + 1e-12)


def test_a_stage_without_cores_or_a_rate_is_refused():
    with pytest.raises(ValueError, match="needs cores and a rate"):
        core_seconds_per_path(1, 0.0)
    with pytest.raises(ValueError, match="needs cores and a rate"):
        work_bound(2, 0, 10.0, 1, 4.0)


def test_a_stages_cores_are_its_pins_or_else_its_threads():
    assert stage_cores([frozenset({0})], threads=1, machine_cores=2) == 1
    assert stage_cores([frozenset({0}), frozenset({1})], threads=1, machine_cores=2) == 2
    assert stage_cores([frozenset({0}), frozenset({0})], threads=1, machine_cores=4) == 1  # shared
    assert stage_cores([None, frozenset({1})], threads=2, machine_cores=3) == 3  # one unpinned
    assert stage_cores([None], threads=1, machine_cores=2) == 1
    assert stage_cores([], threads=1, machine_cores=2) == 0
