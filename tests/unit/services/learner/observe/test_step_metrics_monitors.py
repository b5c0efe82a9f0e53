"""The step metrics the monitors read and the safety stage's counts: the verifier's mean beside
the training reward on the verified sample, the within-group reward spread, and filtered paths
counted by reason (services/learner/observe/step_metrics.py)."""

from __future__ import annotations

import math

import pytest

from brorl import sampling
from brorl.v1 import common_pb2
from services.learner.intake.collect import Consumed, Intake
from services.learner.observe.step_metrics import RunCounters, intake_metrics


def group(gid, rewards, verifier=None, filtered=()):
    g = common_pb2.PathGroup(group_id=gid, generated=len(rewards))
    for i, r in enumerate(rewards):
        p = g.paths.add(path_id=f"{gid}/{i}", reward=r, token_ids=[1], reward_status="ok")
        if verifier is not None and verifier[i] is not None:
            p.verifier_reward, p.verifier_status = verifier[i], "ok"
        if i < len(filtered):
            p.reward_status = "filtered"
            p.reward_components[f"filtered/{filtered[i]}"] = 1.0
    return g


def intake(*groups):
    return Intake(consumed=[Consumed(g, 0, "used") for g in groups])


def test_verifier_metrics_compare_both_rewards_on_the_same_paths():
    a = group("g0", [1.0, 0.0, 1.0], verifier=[0.0, None, 1.0])
    b = group("g1", [2.0, 0.0], verifier=[0.0, 0.0])
    m = intake_metrics(intake(a, b))
    assert m["reward/verified_paths"] == 4
    assert m["reward/verifier_mean"] == pytest.approx(1.0 / 4)
    assert m["reward/verified_reward_mean"] == pytest.approx((1.0 + 1.0 + 2.0 + 0.0) / 4)
    assert "reward/verifier_mean" not in intake_metrics(intake(group("g2", [1.0, 0.0])))


def test_group_std_is_the_mean_within_group_population_std():
    m = intake_metrics(intake(group("g0", [1.0, 0.0]), group("g1", [2.0, 2.0, 2.0, 2.0])))
    assert m["reward/group_std"] == pytest.approx((0.5 + 0.0) / 2)
    # not the std over all paths of the step (which also sees between-group differences)
    every = [1.0, 0.0, 2.0, 2.0, 2.0, 2.0]
    mean = sum(every) / 6
    assert m["reward/group_std"] != pytest.approx(
        math.sqrt(sum((x - mean) ** 2 for x in every) / 6)
    )


def test_filtered_paths_are_counted_by_reason_per_step_and_over_the_run():
    counters = RunCounters()
    step1 = intake(group("g0", [-1.0, -1.0, 1.0, 0.0], filtered=["word", "classifier"]))
    step2 = intake(group("g1", [-1.0, 1.0], filtered=["word"]))
    assert intake_metrics(step1)["reward/filtered_paths"] == 2
    counters.add(step1)
    counters.add(step2)
    assert counters.counts["reward/filtered/word"] == 2
    assert counters.counts["reward/filtered/classifier"] == 1


def test_the_verified_sample_is_a_stable_share_of_the_paths():
    ids = [f"g{g}/{i}" for g in range(200) for i in range(64)]
    chosen = [p for p in ids if sampling.verifies(p, 0.25)]
    assert len(chosen) / len(ids) == pytest.approx(0.25, abs=0.01)
    assert chosen == [p for p in ids if sampling.verifies(p, 0.25)]  # same paths every time
    assert all(sampling.verifies(p, 0.0) and sampling.verifies(p, 1.0) for p in ids[:10])


def test_groups_are_counted_per_stratum_with_their_successes_and_all_equal_ones():
    counters = RunCounters()
    strata = {"p0": "hard", "p1": "hard", "p2": "easy", "p3": ""}
    groups = [
        group("g0", [0.0, 0.0, 1.0]),  # hard, a success
        group("g1", [0.0, 0.0]),  # hard, all equal, no success
        group("g2", [1.0, 1.0, 1.0, 1.0, 1.0]),  # easy, all equal and a success
        group("g3", [0.0, 1.0]),  # no stratum: not counted
        group("g4", [0.25, 0.75]),  # hard, a success at success_reward 0.5
        group("g5", [0.25, 0.375]),  # hard, no path reaches it
    ]
    for g, pid in zip(groups, ["p0", "p1", "p2", "p3", "p1", "p0"]):
        g.prompt_id = pid
    step = Intake(consumed=[Consumed(g, 0, "degenerate" if i == 1 else "used")
                            for i, g in enumerate(groups)])  # fmt: skip
    counters.add(step, lambda g: strata[g.prompt_id], success_reward=0.5)
    c = counters.counts
    assert (c["explore/groups/hard"], c["explore/success_groups/hard"]) == (4, 2)
    assert c["explore/all_equal_groups/hard"] == 1
    assert (c["explore/groups/easy"], c["explore/success_groups/easy"]) == (1, 1)
    assert c["explore/all_equal_groups/easy"] == 1
    assert not [k for k in c if k.startswith("explore/") and k.endswith("/")]  # unlabelled: none
    counters.add(step)  # no strata given: nothing per stratum
    assert c["explore/groups/hard"] == 4
