"""What bench/e2e.py reads from a run's per-step metrics (bench/pipeline/steps.py): the steady
rate leaves out the pipeline's fill; the learner's compute leaves out its first update, as the
standalone update's untimed warm-up does; the update's runnable share."""

from __future__ import annotations

import pytest

from bench.pipeline.steps import learner_compute, steady_rate, step_phases


def step(forward, backward, optimizer, positions, update, runnable, paths=64.0, tokens=200.0):
    return {
        "learner/forward_s": forward,
        "learner/backward_s": backward,
        "learner/optimizer_s": optimizer,
        "learner/positions": positions,
        "learner/update_s": update,
        "learner/update_running_s": update - runnable,
        "learner/update_runnable_s": runnable,
        "learner/paths": paths,
        "learner/tokens": tokens,
        "rollout/samples_per_s": 100.0,
        "rollout/step_generated": 50.0,
        "rollout/step_groups": 5.0,
    }


def test_the_steady_rate_leaves_out_the_first_steps_fill():
    # the first step waits 3 s for its groups; then 100 paths every 0.5 s, one step 130
    times = [3.5, 4.0, 4.5, 5.25]
    generated = [100.0, 200.0, 300.0, 430.0]
    assert steady_rate(times, generated, whole=430 / 5.25) == pytest.approx(330 / 1.75)
    assert steady_rate(times[:1], generated[:1], whole=7.0) == 7.0  # one step: the whole run's
    assert steady_rate([2.0, 2.0], [5.0, 9.0], whole=3.0) == 3.0  # no time between the steps


def test_the_learners_compute_leaves_out_its_first_update_but_counts_every_path():
    steps = [
        step(0.5, 0.9, 0.3, 1000.0, 1.9, 0.0),  # the first: the process's first backward
        step(0.1, 0.2, 0.05, 900.0, 0.4, 0.1, paths=32.0, tokens=90.0),
        step(0.12, 0.21, 0.07, 1100.0, 0.44, 0.01),
    ]
    got = learner_compute(steps)
    assert got.seconds == pytest.approx(0.1 + 0.2 + 0.05 + 0.12 + 0.21 + 0.07)
    assert got.positions == 2000.0
    assert got.update_s == pytest.approx(0.84)
    assert got.runnable_share == pytest.approx(0.11 / 0.84)
    assert (got.paths, got.tokens) == (160.0, 490.0)  # the run's paths: the first's too
    # the run's shape, for the standalone update: every update's, the first's too
    assert got.mean_completion == pytest.approx(490 / 160)
    assert got.padded_completion == pytest.approx(3000 / 160 + 1)


def test_a_run_of_one_update_times_that_update():
    got = learner_compute([step(0.5, 0.9, 0.3, 1000.0, 2.0, 0.5)])
    assert got.seconds == pytest.approx(1.7)
    assert got.positions == 1000.0
    assert got.runnable_share == pytest.approx(0.25)


def test_the_standalone_side_times_as_many_updates_as_fit_its_budget():
    short = [step(0.05, 0.1, 0.05, 900.0, 0.25, 0.0) for _ in range(31)]  # 0.2 s each
    assert learner_compute(short).updates == 30
    assert learner_compute(short).standalone_updates == 30  # 30 x 0.2 s fits 10 s
    assert learner_compute(short[:4]).standalone_updates == 3  # never more than the run's
    tiny = [step(0.0625, 0.03125, 0.03125, 900.0, 0.2, 0.0) for _ in range(400)]  # 0.125 s each
    assert learner_compute(tiny).standalone_updates == 80  # 80 x 0.125 s = 10 s
    long = [step(1.4, 2.3, 0.05, 9000.0, 3.8, 0.1) for _ in range(24)]  # 3.75 s each
    assert learner_compute(long).standalone_updates == 3  # at least three


def test_a_learner_without_schedstat_has_no_runnable_share():
    steps = [step(0.1, 0.2, 0.05, 900.0, 0.4, 0.1) for _ in range(3)]
    for m in steps:
        del m["learner/update_runnable_s"], m["learner/update_running_s"]
    assert learner_compute(steps).runnable_share == 0.0
    assert step_phases(steps, 0.01)["update_runnable"] == 0.0


def test_the_phases_hold_the_updates_running_and_runnable_means():
    steps = [step(0.1, 0.2, 0.05, 900.0, 0.4, 0.1), step(0.1, 0.2, 0.05, 900.0, 0.6, 0.3)]
    phases = step_phases(steps, worker_alone_generate=0.02)
    assert phases["update_runnable"] == pytest.approx(0.2)
    assert phases["update_running"] == pytest.approx(0.3)
    assert phases["forward"] == pytest.approx(0.1)
    assert phases["rollout_generate_per_group"] == pytest.approx(0.1)  # 50 paths / 100/s / 5
    assert phases["worker_alone_generate_per_group"] == 0.02
