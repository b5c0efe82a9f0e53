"""Name → reward function. The service builds one registry at start-up from its config
(``build_registry``).

``Registry.score`` is the one place scores leave a function: a function that raises yields status
"error" for its items (never an exception), rewards are clipped to ±clip, and every path gets a
latency.
Names of the form ``composite:a=0.5,b=0.5`` are built on the fly from registered components, and
``math_answer:reference_kind=solution`` from a registered math function with a run's own options.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from brorl.contract import RewardStatus
from brorl.errors import InvalidArgument
from services.reward.base import RewardFunction, Score, ScoreItem

log = logging.getLogger(__name__)
MAX_INLINE = 64  # inline composites kept built at once


class Registry:
    def __init__(self, functions: list[RewardFunction] = (), clip: float = 3.0):
        self._functions: dict[str, RewardFunction] = {}
        self._inline: dict[str, RewardFunction] = {}
        self._lock = threading.Lock()
        self.clip = clip
        for fn in functions:
            self.add(fn)

    def add(self, fn: RewardFunction) -> None:
        if fn.name in self._functions:
            raise ValueError(f"reward function {fn.name!r} registered twice")
        self._functions[fn.name] = fn

    def get(self, name: str) -> RewardFunction:
        if name in self._functions:
            return self._functions[name]
        from services.reward.functions.composite import INLINE_PREFIX, Composite, parse_inline

        if name.startswith(INLINE_PREFIX):
            with self._lock:
                if name not in self._inline:
                    weights = parse_inline(name)
                    unknown = [c for c in weights if c not in self._functions]
                    if unknown:
                        raise InvalidArgument(
                            "reward_fn",
                            f"composite component(s) {unknown} unknown; available: "
                            f"{', '.join(self.names())}",
                        )
                    if len(self._inline) >= MAX_INLINE:
                        self._inline.pop(next(iter(self._inline)))
                    self._inline[name] = Composite(name, weights, self)
                return self._inline[name]
        base, sep, options = name.partition(":")
        if sep and hasattr(self._functions.get(base), "with_options"):
            return self._with_options(name, base, options)
        known = ", ".join(self.names()) or "none"
        raise InvalidArgument(
            "reward_fn",
            f"unknown reward function {name!r}; available: {known} (or composite:name=weight,...)",
        )

    def _with_options(self, name: str, base: str, options: str) -> RewardFunction:
        """``math_answer:reference_kind=solution``: a registered math function with a run's own
        comparison options, built once and kept with the inline composites."""
        with self._lock:
            if name not in self._inline:
                fn = self._functions[base].with_options(name, options)
                if len(self._inline) >= MAX_INLINE:
                    _close(self._inline.pop(next(iter(self._inline))))
                self._inline[name] = fn
            return self._inline[name]

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
            log.warning(
                "reward function %s failed on %d items: %s: %s",
                name,
                len(items),
                type(exc).__name__,
                exc,
            )
            scores = [
                Score(
                    0.0,
                    status=RewardStatus.ERROR,
                    detail=f"{name} failed: {type(exc).__name__}: {exc}",
                )
                for _ in items
            ]
        elapsed_ms = (time.perf_counter() - start) * 1000 / max(len(items), 1)
        for s in scores:
            if not s.latency_ms:
                s.latency_ms = elapsed_ms
            if not math.isfinite(s.reward):
                s.reward, s.status, s.detail = (
                    0.0,
                    RewardStatus.ERROR,
                    f"{name} returned a non-finite reward ({s.reward})",
                )
            elif self.clip:
                s.reward = max(-self.clip, min(self.clip, s.reward))
        return scores

    def check_references(self) -> None:
        """Every name a composite or pipeline uses exists, and no function depends on itself."""
        for name, fn in self._functions.items():
            for dep in getattr(fn, "dependencies", lambda: [])():
                if dep not in self._functions:
                    raise InvalidArgument(
                        f"functions.{name}",
                        f"uses unknown function {dep!r}; available: {', '.join(self.names())}",
                    )

        def visit(name: str, path: list[str]) -> None:
            if name in path:
                raise InvalidArgument(
                    f"functions.{name}", f"depends on itself: {' -> '.join(path + [name])}"
                )
            for dep in getattr(self._functions[name], "dependencies", lambda: [])():
                visit(dep, path + [name])

        for name in self._functions:
            visit(name, [])

    def warm(self) -> None:
        """Load what functions load lazily (models), so the service is ready when it says
        SERVING."""
        for fn in self._functions.values():
            if hasattr(fn, "warm"):
                fn.warm()

    def close(self) -> None:
        for fn in [*self._inline.values(), *self._functions.values()]:
            _close(fn)


def _close(fn: RewardFunction) -> None:
    if hasattr(fn, "close"):
        try:
            fn.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            log.exception("closing reward function %s", fn.name)


def build_function(name: str, spec, registry: Registry) -> RewardFunction:
    kind = spec.type
    if kind == "math_answer":
        from services.reward.functions.math_verifier import MathAnswer

        return MathAnswer(name, spec)
    if kind == "exact_match":
        from services.reward.functions.math_verifier import ExactMatch

        return ExactMatch(name, spec.strip)
    if kind == "format":
        from services.reward.functions.math_verifier import FormatReward

        return FormatReward(name, spec.pattern)
    if kind == "code":
        from services.reward.functions.code_reward import CodeReward

        return CodeReward(name, spec)
    if kind == "reward_model":
        from services.reward.functions.reward_model import RewardModel

        return RewardModel(name, spec)
    if kind in ("relevance", "safety", "diversity"):
        from services.reward.functions import text_rewards

        return {
            "relevance": text_rewards.Relevance,
            "safety": text_rewards.Safety,
            "diversity": text_rewards.Diversity,
        }[kind](name, spec)
    if kind == "countdown":
        from services.reward.functions.countdown import Countdown

        return Countdown(name, spec)
    if kind == "composite":
        from services.reward.functions.composite import Composite

        return Composite(name, spec.components, registry)
    if kind == "judge":
        from services.reward.functions.judge import LLMJudge

        return LLMJudge(name, spec)
    if kind == "pipeline":
        from services.reward.functions.pipeline import Pipeline

        return Pipeline(name, spec, registry)
    raise InvalidArgument(f"functions.{name}.type", f"unknown type {kind!r}")


def build_registry(config) -> Registry:
    """The registry for a RewardServiceConfig: the built-ins (config.BUILTIN_FUNCTIONS with their
    default settings), overridden and extended by config.functions."""
    from services.reward.config import BUILTIN_FUNCTIONS

    specs = {
        **{name: builtin.spec() for name, builtin in BUILTIN_FUNCTIONS.items()},
        **config.functions,
    }
    registry = Registry(clip=config.clip)
    try:
        for name, spec in specs.items():
            registry.add(build_function(name, spec, registry))
        registry.check_references()
    except Exception:
        registry.close()
        raise
    return registry


def default_registry() -> Registry:
    from services.reward.config import RewardServiceConfig

    return build_registry(RewardServiceConfig())
