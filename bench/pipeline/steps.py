"""What bench/e2e.py reads from a run's per-step metrics (the learner's metrics.jsonl lines that
hold ``learner/loss``): the mean seconds of each learner and rollout phase, the learner's compute
for its FLOP/s, and the steady rate after the pipeline's fill."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

PHASES = ("wait", "batch", "forward", "backward", "optimizer", "publish", "publish_wait")
COMPUTE = ("forward", "backward", "optimizer")  # the phases the learner's FLOP/s count


def _mean(steps: list[dict], key: str) -> float:
    return statistics.fmean(m.get(key, 0.0) for m in steps)


def step_phases(steps: list[dict], worker_alone_generate: float) -> dict[str, float]:
    """Mean seconds a step of each learner phase and, per group, of each rollout phase;
    ``worker_alone_generate``: a group's generate seconds in the worker loop alone."""
    phases = {ph: _mean(steps, f"learner/{ph}_s") for ph in PHASES}
    phases["rollout_generate_per_group"] = statistics.fmean(
        m["rollout/samples_per_s"]
        and m["rollout/step_generated"]
        / m["rollout/samples_per_s"]
        / max(m["rollout/step_groups"], 1)
        for m in steps
    )
    phases["publish_thread"] = _mean(steps, "learner/publish_thread_s")  # off the step
    # of forward + backward + optimizer: on the workers' cores too (services/learner/cores.py)
    phases["borrowed"] = _mean(steps, "learner/borrowed_s")
    # of the update: its thread on a core, and ready to run but waiting for one (another
    # process or thread had it; services/learner/observe/thread_clock.py)
    phases["update_running"] = _mean(steps, "learner/update_running_s")
    phases["update_runnable"] = _mean(steps, "learner/update_runnable_s")
    phases["reward_score_per_group"] = _mean(steps, "reward/latency_ms") / 1000
    # a worker's time between two jobs: reloading published weights, then waiting for work
    phases["rollout_reload_per_group"] = _mean(steps, "rollout/reload_s")
    phases["rollout_idle_per_group"] = _mean(steps, "rollout/idle_s")
    # of those two: holding a job for the weight version it asks for (min_weight_version)
    phases["rollout_version_wait_per_group"] = _mean(steps, "rollout/version_wait_s")
    # before a call: waiting for an earlier call's tail (select, score, publish) to finish
    phases["rollout_tail_wait_per_group"] = _mean(steps, "rollout/tail_wait_s")
    phases["worker_alone_generate_per_group"] = worker_alone_generate  # no learner
    # inside generate: vLLM's queue wait, prefill (to the first token) and decode; then the
    # Redis write + ack of the finished group
    for part in ("queue", "prefill", "decode", "publish"):
        phases[f"rollout_{part}_per_group"] = _mean(steps, f"rollout/{part}_s")
    return phases


# seconds of compute the standalone update is given to time (LearnerCompute.standalone_updates)
STANDALONE_BUDGET_S = 10.0


@dataclass(frozen=True)
class LearnerCompute:
    """The learner's updates in the pipeline, the first one left out where there are more: it
    pays the process's first backward and optimizer step, as the standalone update's untimed
    warm-up does (bench/learner_update.py), so both sides time updates after the first."""

    seconds: float  # forward + backward + optimizer
    positions: float  # token positions run forward and backward, one pass (learner/positions)
    update_s: float  # the updates' whole seconds (batch included)
    runnable_s: float  # of update_s: the training thread waiting for a core
    paths: float  # every update's, the first included
    tokens: float  # completion tokens, every update's
    every_positions: float  # every update's positions, the first included
    updates: int = 1  # the updates timed (seconds, positions, update_s are theirs)

    @property
    def standalone_updates(self) -> int:
        """Updates for the standalone side to time: as many as fit ``STANDALONE_BUDGET_S`` at
        the pipeline's mean, at least 3, at most as many as the pipeline timed. A demo_fast
        update is ~0.25 s: three of them moved the standalone figure by a fifth between runs."""
        mean = self.seconds / max(self.updates, 1)
        fit = int(STANDALONE_BUDGET_S / max(mean, 1e-9))
        return max(3, min(self.updates, fit))

    @property
    def runnable_share(self) -> float:
        return self.runnable_s / max(self.update_s, 1e-9)

    @property
    def mean_completion(self) -> float:
        """Completion tokens a path, over the run."""
        return self.tokens / max(self.paths, 1.0)

    @property
    def padded_completion(self) -> float:
        """Completion positions a path had in its padded micro-batch, over the run
        (Batch.positions counts C - 1 of a completion of C)."""
        return self.every_positions / max(self.paths, 1.0) + 1


def learner_compute(steps: list[dict]) -> LearnerCompute:
    timed = steps[1:] or steps
    return LearnerCompute(
        seconds=sum(m.get(f"learner/{ph}_s", 0.0) for m in timed for ph in COMPUTE),
        positions=sum(m.get("learner/positions", 0.0) for m in timed),
        update_s=sum(m.get("learner/update_s", 0.0) for m in timed),
        runnable_s=sum(m.get("learner/update_runnable_s", 0.0) for m in timed),
        paths=sum(m.get("learner/paths", 0.0) for m in steps),
        tokens=sum(m.get("learner/tokens", 0.0) for m in steps),
        every_positions=sum(m.get("learner/positions", 0.0) for m in steps),
        updates=len(timed),
    )


def steady_rate(times: list[float], generated: list[float], whole: float) -> float:
    """Paths a second between the first step's end and the last's (``times`` and cumulative
    ``generated`` per step); ``whole`` (the whole run's rate) for a run of one step."""
    if len(times) < 2 or times[-1] <= times[0]:
        return whole
    return (generated[-1] - generated[0]) / (times[-1] - times[0])
