"""Composite reward: a weighted sum of named registry functions, returning the total and every
component.

Configured (``type: composite``, ``components: {relevance: 0.4, safety: 0.4, diversity: 0.2}``) or
asked for inline by name: ``reward_fn="composite:relevance=0.4,safety=0.4,diversity=0.2"``.
A component that does not end ok contributes its (zero) reward and lends the composite its status
(filtered over error over timeout), with a detail naming the component.
"""

from __future__ import annotations

import math

from brorl.contract import RewardStatus
from brorl.errors import InvalidArgument
from services.reward.base import Score, ScoreItem
from services.reward.config import check_weights

INLINE_PREFIX = "composite:"
# which status a composite takes from its components: the worst one
_STATUS_RANK = {status: rank for rank, status in enumerate(RewardStatus.ALL)}


def parse_inline(name: str) -> dict[str, float]:
    """``composite:a=0.5,b=0.5`` → {"a": 0.5, "b": 0.5}; InvalidArgument saying what to fix."""
    body = name[len(INLINE_PREFIX) :].strip()
    example = "write composite:relevance=0.5,safety=0.3,diversity=0.2"
    if not body:
        raise InvalidArgument("reward_fn", f"composite has no components; {example}")
    weights: dict[str, float] = {}
    for part in body.split(","):
        if "=" not in part:
            raise InvalidArgument(
                "reward_fn", f"composite component {part.strip()!r} has no weight; {example}"
            )
        key, raw = (s.strip() for s in part.split("=", 1))
        if not key:
            raise InvalidArgument(
                "reward_fn", f"composite component with weight {raw!r} has no name; {example}"
            )
        if key in weights:
            raise InvalidArgument(
                "reward_fn", f"composite names {key!r} twice; give each component once"
            )
        try:
            weights[key] = float(raw)
        except ValueError:
            raise InvalidArgument(
                "reward_fn", f"weight of {key!r} must be a number, got {raw!r}; {example}"
            ) from None
    try:
        check_weights(weights)
    except ValueError as exc:
        raise InvalidArgument("reward_fn", f"composite weights: {exc}") from None
    return weights


class Composite:
    def __init__(self, name: str, components: dict[str, float], registry):
        self.name = name
        self.components = dict(components)
        self.registry = registry
        self.description = "Weighted sum: " + " + ".join(
            f"{w:g}*{n}" for n, w in self.components.items()
        )

    def dependencies(self) -> list[str]:
        return list(self.components)

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        totals = [0.0] * len(items)
        comps: list[dict[str, float]] = [{} for _ in items]
        status = [RewardStatus.OK] * len(items)
        detail = [""] * len(items)
        latency = [0.0] * len(items)
        for comp, weight in self.components.items():
            for i, s in enumerate(self.registry.score(comp, items)):
                reward = s.reward if math.isfinite(s.reward) else 0.0
                totals[i] += weight * reward
                comps[i][comp] = reward
                latency[i] += s.latency_ms
                if (
                    _STATUS_RANK.get(s.status, _STATUS_RANK[RewardStatus.ERROR])
                    > _STATUS_RANK[status[i]]
                ):
                    status[i] = s.status if s.status in _STATUS_RANK else RewardStatus.ERROR
                    detail[i] = f"{comp}: {s.status}: {s.detail}"
        return [
            Score(
                totals[i],
                status=status[i],
                detail=detail[i],
                components=comps[i],
                latency_ms=latency[i],
            )
            for i in range(len(items))
        ]
