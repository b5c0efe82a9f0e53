"""Sampling-temperature schedules over learner steps (pure Python; safe to import anywhere).

A schedule is a small frozen dataclass, callable as ``schedule(step) -> temperature``:

* ``constant(t)``: ``t`` at every step.
* ``staged(bounds, temps)``: ``temps[i]`` for ``bounds[i-1] <= step < bounds[i]``: temps[0]
  before bounds[0], temps[-1] from bounds[-1] on. ``len(temps) == len(bounds) + 1``, bounds
  strictly increasing non-negative integers.
* ``linear(t0, t1, steps)``: ``t0`` at step 0, linear to ``t1`` at ``steps``, ``t1`` after.

``temperature_at(config, step)`` reads the run-config form, e.g.
``{"kind": "staged", "bounds": [1000, 3000], "temps": [1.3, 0.9, 0.7]}``,
``{"kind": "linear", "t0": 1.2, "t1": 0.7, "steps": 2000}``, ``{"kind": "constant", "t": 1.0}``;
``from_config`` builds the schedule once (validating it) for callers that ask every step.
Temperatures must be finite and > 0 (wide sampling needs a stochastic policy); steps ≥ 0.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union


def _temperature(value: Any, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a finite temperature > 0, got {value!r}")
    return float(value)


def _step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    return step


@dataclass(frozen=True)
class Constant:
    t: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "t", _temperature(self.t, "t"))

    def __call__(self, step: int) -> float:
        _step(step)
        return self.t


@dataclass(frozen=True)
class Staged:
    bounds: tuple[int, ...] = (1000, 3000)
    temps: tuple[float, ...] = (1.3, 0.9, 0.7)

    def __post_init__(self) -> None:
        bounds, temps = tuple(self.bounds), tuple(self.temps)
        if len(temps) != len(bounds) + 1:
            raise ValueError(
                f"staged needs len(temps) == len(bounds) + 1, got {len(temps)} temps "
                f"for {len(bounds)} bounds"
            )
        for b in bounds:
            if isinstance(b, bool) or not isinstance(b, int) or b < 0:
                raise ValueError(f"staged bounds must be integers >= 0, got {b!r}")
        if any(b1 <= b0 for b0, b1 in zip(bounds, bounds[1:])):
            raise ValueError(f"staged bounds must be strictly increasing, got {list(bounds)}")
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(
            self, "temps", tuple(_temperature(t, f"temps[{i}]") for i, t in enumerate(temps))
        )

    def __call__(self, step: int) -> float:
        return self.temps[bisect.bisect_right(self.bounds, _step(step))]


@dataclass(frozen=True)
class Linear:
    t0: float = 1.2
    t1: float = 0.7
    steps: int = 2000

    def __post_init__(self) -> None:
        object.__setattr__(self, "t0", _temperature(self.t0, "t0"))
        object.__setattr__(self, "t1", _temperature(self.t1, "t1"))
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"linear steps must be an integer >= 1, got {self.steps!r}")

    def __call__(self, step: int) -> float:
        step = _step(step)
        if step >= self.steps:
            return self.t1
        return self.t0 + (self.t1 - self.t0) * (step / self.steps)


Schedule = Union[Constant, Staged, Linear]


def constant(t: float = 1.0) -> Constant:
    return Constant(t)


def staged(
    bounds: Sequence[int] = (1000, 3000), temps: Sequence[float] = (1.3, 0.9, 0.7)
) -> Staged:
    return Staged(tuple(bounds), tuple(temps))


def linear(t0: float = 1.2, t1: float = 0.7, steps: int = 2000) -> Linear:
    return Linear(t0, t1, steps)


_KINDS: dict[str, tuple[Callable[..., Schedule], frozenset[str]]] = {
    "constant": (constant, frozenset({"t"})),
    "staged": (staged, frozenset({"bounds", "temps"})),
    "linear": (linear, frozenset({"t0", "t1", "steps"})),
}
KINDS = tuple(_KINDS)


def from_config(schedule_config: Mapping[str, Any]) -> Schedule:
    """{"kind": ..., **params} -> schedule; unknown kind or parameter -> ValueError. Missing
    parameters take the defaults of constant/staged/linear."""
    if not isinstance(schedule_config, Mapping):
        raise ValueError(
            "a temperature schedule config must be a mapping with a 'kind', "
            f"got {schedule_config!r}"
        )
    kind = schedule_config.get("kind")
    if kind not in _KINDS:
        raise ValueError(
            f"unknown temperature schedule kind {kind!r}; valid kinds: {', '.join(KINDS)}"
        )
    make, allowed = _KINDS[kind]
    params = {k: v for k, v in schedule_config.items() if k != "kind"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for a {kind!r} schedule; allowed: {sorted(allowed)}"
        )
    return make(**params)


def temperature_at(schedule_config: Mapping[str, Any], step: int) -> float:
    """Sampling temperature at learner step ``step`` for a schedule config."""
    return from_config(schedule_config)(step)
