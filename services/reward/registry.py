"""Name → reward function. The service builds one registry at start-up from its config."""
from __future__ import annotations

import time

from brorl.errors import InvalidArgument
from services.reward.base import RewardFunction, Score, ScoreItem


class Registry:
    def __init__(self, functions: list[RewardFunction] = ()):
        self._functions: dict[str, RewardFunction] = {}
        for fn in functions:
            self.add(fn)

    def add(self, fn: RewardFunction) -> None:
        if fn.name in self._functions:
            raise ValueError(f"reward function {fn.name!r} registered twice")
        self._functions[fn.name] = fn

    def get(self, name: str) -> RewardFunction:
        if name not in self._functions:
            known = ", ".join(sorted(self._functions)) or "none"
            raise InvalidArgument("reward_fn", f"unknown reward function {name!r}; available: {known}")
        return self._functions[name]

    def names(self) -> list[str]:
        return sorted(self._functions)

    def describe(self) -> list[tuple[str, str]]:
        return [(name, self._functions[name].description) for name in self.names()]

    def score(self, name: str, items: list[ScoreItem]) -> list[Score]:
        """Score with ``name``; a function that crashes yields status "error" for its items."""
        fn = self.get(name)
        start = time.perf_counter()
        try:
            scores = fn.score_batch(items)
            if len(scores) != len(items):
                raise RuntimeError(f"returned {len(scores)} scores for {len(items)} items")
        except Exception as exc:  # noqa: BLE001 - one broken function must not take the service down
            scores = [Score(0.0, status="error", detail=f"{name} failed: {type(exc).__name__}: {exc}") for _ in items]
        elapsed_ms = (time.perf_counter() - start) * 1000 / max(len(items), 1)
        for s in scores:
            if not s.latency_ms:
                s.latency_ms = elapsed_ms
        return scores


def default_registry() -> Registry:
    from services.reward.math_verifier import FormatReward, MathAnswer
    return Registry([MathAnswer(), FormatReward()])
