"""The most a pipeline of two stages can make of a machine's cores (bench/e2e.py's
``work_bound_paths_per_s``).

``pipeline_ratio`` compares the run with the rollout alone, which is the right yardstick while
the rollout is the slower stage. Where the learner is (the long shape on a CPU without native
bf16: training a token costs about three times sampling it), no pipeline reaches the rollout's
own pace, and the question is how close it comes to what the cores allow. Each stage alone costs
``cores / paths_per_s`` core-seconds a path; a pipeline that shared every core between the two
with no loss (the learner borrowing the worker's core while it idles, the worker sampling while
the learner waits) would train ``machine_cores`` ÷ the sum of the two a second. Nothing real
gets there: it is a bound, and a run's ``work_bound_ratio`` is the share of it the run keeps.

What it leaves out: the rollout alone's scoring and its worker's tail run on other cores than
the engine's (the reward service is not pinned), so its core-seconds a path are counted low and
the bound is higher than what can be reached, most where scoring is a large share of a path
(the demo's 3-token completions) and least where sampling is (the long shape).
"""

from __future__ import annotations


def core_seconds_per_path(cores: float, paths_per_s: float) -> float:
    """Core-seconds one path costs a stage that made ``paths_per_s`` on ``cores`` cores."""
    if cores <= 0 or paths_per_s <= 0:
        raise ValueError(f"a stage needs cores and a rate (got {cores} cores, {paths_per_s}/s)")
    return cores / paths_per_s


def work_bound(
    machine_cores: float,
    rollout_cores: float,
    rollout_paths_per_s: float,
    learner_cores: float,
    learner_paths_per_s: float,
) -> float:
    """Paths a second ``machine_cores`` could train if the rollout (``rollout_paths_per_s`` on
    ``rollout_cores`` alone) and the learner (``learner_paths_per_s`` on ``learner_cores`` alone)
    shared them with no loss: ``machine_cores`` ÷ (core-seconds a path of both)."""
    per_path = core_seconds_per_path(rollout_cores, rollout_paths_per_s) + core_seconds_per_path(
        learner_cores, learner_paths_per_s
    )
    return machine_cores / per_path


def stage_cores(pins: list[frozenset[int] | None], threads: int, machine_cores: int) -> int:
    """Cores a stage's processes ran on: the union of their pins where every one is pinned
    (the launcher's placement), else their threads (``threads`` each), at most the machine's."""
    if pins and all(p is not None for p in pins):
        return len(frozenset().union(*pins))
    return min(len(pins) * max(threads, 1), machine_cores)
