"""The metrics of one learner step, built in one place from what the step consumed (every
group of the step, used or dropped) and what the update reported. Names: docs/observability.md."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from brorl.contract import RewardStatus
from brorl.v1 import common_pb2
from services.learner.intake.collect import Intake


def reward_entropy(rewards: list[float]) -> float:
    """Entropy (nats) of one group's empirical reward distribution: 0 when all agree."""
    counts = Counter(round(r, 6) for r in rewards)
    total = len(rewards)
    return -sum(c / total * math.log(c / total) for c in counts.values())


class RunCounters:
    """Cumulative counts over the run (checkpointed with it)."""

    def __init__(self, counts: dict[str, float] | None = None):
        self.counts: Counter = Counter(counts or {})

    def add(
        self,
        intake: Intake,
        stratum_of: Callable[[common_pb2.PathGroup], str] = lambda g: "",
        success_reward: float = 1.0,
    ) -> None:
        """Count what a step consumed. ``stratum_of``: a group's prompt stratum ('' for none;
        data.fields.stratum); per named stratum ``explore/groups/<s>``,
        ``explore/success_groups/<s>`` (a path with reward >= ``success_reward``) and
        ``explore/all_equal_groups/<s>``."""
        c = self.counts
        for item in intake.consumed:
            group = item.group
            if group.paths and (stratum := stratum_of(group)):
                rewards = [p.reward for p in group.paths]
                c[f"explore/groups/{stratum}"] += 1
                c[f"explore/success_groups/{stratum}"] += max(rewards) >= success_reward
                c[f"explore/all_equal_groups/{stratum}"] += len(set(rewards)) == 1
            c["rollout/groups"] += 1
            c["rollout/paths"] += len(group.paths)
            c["rollout/generated"] += group.generated or len(group.paths)
            c["rollout/tokens"] += sum(len(p.token_ids) for p in group.paths)
            for path in group.paths:
                c[f"rollout/paths_by/{path.worker}"] += 1
            for reason, count in group.dropped.items():
                c[f"rollout/dropped/{reason}"] += count
            if item.outcome == "stale":
                c["learner/dropped_stale"] += 1
            elif item.outcome == "degenerate":
                c["learner/skipped_degenerate"] += 1  # no signal: all advantages 0
            if item.outcome != "used":
                c[f"learner/dropped_groups/{item.outcome}"] += 1
                c[f"learner/dropped_paths/{item.outcome}"] += len(group.paths)
            for status, count in item.excluded.items():
                c[f"learner/excluded_paths/{status}"] += count
            for path in group.paths:
                if path.reward_status == RewardStatus.FILTERED:
                    c[f"reward/filtered/{filter_reason(path)}"] += 1
        c["learner/partial_groups"] += intake.partial_groups


def filter_reason(path) -> str:
    """Why the reward service's safety stage filtered a path: its ``filtered/<reason>``
    component (services/reward/functions/safety_filter.py)."""
    reasons = [k.split("/", 1)[1] for k in path.reward_components if k.startswith("filtered/")]
    return reasons[0] if reasons else "unknown"


def verifier_metrics(groups) -> dict[str, float]:
    """The held-out verifier's mean on the paths the workers verified, beside the training
    reward's mean on the same paths (the reward-hacking monitor compares the two)."""
    sample = [p for g in groups for p in g.paths if p.verifier_status == RewardStatus.OK]
    if not sample:
        return {}
    return {
        "reward/verified_paths": float(len(sample)),
        "reward/verifier_mean": _mean([p.verifier_reward for p in sample]),
        "reward/verified_reward_mean": _mean([p.reward for p in sample]),
    }


def intake_metrics(intake: Intake) -> dict[str, float]:
    """Rollout, reward and exploration metrics over every group the step consumed."""
    groups = [c.group for c in intake.consumed]
    used = [c for c in intake.consumed if c.outcome == "used"]
    lengths = sorted(len(p.token_ids) for g in groups for p in g.paths) or [0]
    rewards = [p.reward for g in groups for p in g.paths]
    generated = sum(g.generated or len(g.paths) for g in groups)
    gen_s = sum(g.generate_seconds for g in groups)
    out = {
        "rollout/step_groups": float(len(groups)),
        "rollout/step_generated": float(generated),
        "rollout/tokens_per_s": sum(lengths) / max(gen_s, 1e-9),
        "rollout/samples_per_s": generated / max(gen_s, 1e-9),
        "rollout/length_mean": sum(lengths) / len(lengths),
        "rollout/length_p90": float(lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))]),
        "rollout/staleness": float(max((c.staleness for c in used), default=0)),
        "rollout/workers_in_group": _mean([len({p.worker for p in g.paths}) for g in groups]),
        "reward/latency_ms": 1000 * _mean([g.score_seconds for g in groups]),
        "reward/mean": _mean(rewards),
        # groups whose rewards differ (a non-zero advantage), of the step's groups with paths
        "explore/mixed_groups": _mean(
            [float(len({p.reward for p in g.paths}) > 1) for g in groups if g.paths]
        ),
        "explore/reward_entropy": _mean(
            [reward_entropy([p.reward for p in g.paths]) for g in groups if g.paths]
        ),
        "reward/group_std": _mean([_std([p.reward for p in g.paths]) for g in groups if g.paths]),
        "reward/filtered_paths": float(
            sum(p.reward_status == RewardStatus.FILTERED for g in groups for p in g.paths)
        ),
        "learner/staleness_mean": _mean([c.staleness for c in used]),
        "learner/duplicate_groups": float(intake.duplicate_groups),
        "learner/duplicate_parts": float(intake.duplicate_parts),
    }
    if used:  # the oldest weights the step trained on: the guard's rollback horizon
        out["learner/oldest_version"] = float(min(c.group.weight_version for c in used))
    out.update(verifier_metrics(groups))
    # the workers' per-group statistics (PDI, filter thresholds, ...), weighted by generated
    stats: Counter = Counter()
    weights: Counter = Counter()
    for g in groups:
        for k, v in g.stats.items():
            stats[k] += v * max(g.generated, 1)
            weights[k] += max(g.generated, 1)
    out.update({k: stats[k] / weights[k] for k in stats})
    return out


def step_metrics(
    intake: Intake, update: dict[str, float], counters: RunCounters
) -> dict[str, float]:
    """All metrics of a step. ``update``: the policy update's statistics, including
    ``learner/nonzero_paths`` (paths with a non-zero advantage that reached the update)."""
    out = intake_metrics(intake)
    out.update({k: float(v) for k, v in counters.counts.items()})
    out.update(update)
    # effective update ratio: paths with a non-zero advantage that reach the update per path
    # generated for this step (dropped, stale and all-equal groups included)
    out["explore/eur"] = update.get("learner/nonzero_paths", 0.0) / max(
        out["rollout/step_generated"], 1
    )
    return out


def _std(values: list[float]) -> float:
    m = _mean(values)
    return math.sqrt(_mean([(v - m) ** 2 for v in values]))


def _mean(values) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0
