"""Per-step detectors over the learner's metrics (docs/monitors.md), and the running window
they read.

Each detector is a pure function of a metric series (oldest first, the current step last) and
its thresholds, returning a ``Reading``: the statistic logged as ``monitor/<name>`` and whether
it alarms. A spike or collapse compares the current value with the MEDIAN of the ``window``
steps before it (one noisy step does not move a median); the reward-hacking detector compares
the least-squares change, over the last ``window`` steps, of the training reward and of the
held-out verifier on the same sample of paths. A detector whose metric is missing, or whose
window is not full yet, reads NaN and never alarms (floors excepted: they need no history).

``Monitors`` keeps the windows and runs every enabled detector on a step's metrics; what an
alarm does is services/learner/guard/actions.py's business.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from brorl.config.monitors import MonitorsConfig

NAN = float("nan")


@dataclass(frozen=True)
class Reading:
    value: float  # the statistic logged as monitor/<name> (NaN: not enough data)
    fired: bool
    detail: str = ""


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def fitted_change(values: Sequence[float]) -> float:
    """Change over the series of its least-squares line: slope × (len − 1), in float64."""
    n = len(values)
    if n < 2:
        return 0.0
    xm, ym = (n - 1) / 2, math.fsum(values) / n
    sxy = math.fsum((i - xm) * (v - ym) for i, v in enumerate(values))
    sxx = math.fsum((i - xm) ** 2 for i in range(n))
    return sxy / sxx * (n - 1)


def _ratio(series: Sequence[float], window: int) -> float:
    """Current value / median of the ``window`` values before it; NaN until the window is full."""
    if len(series) < window + 1:
        return NAN
    base = median(series[-window - 1 : -1])
    if base <= 0:
        return math.inf if series[-1] > 0 else 1.0
    return series[-1] / base


def spike(series: Sequence[float], window: int, factor: float, floor: float = 0.0) -> Reading:
    """Alarm when the current value exceeds ``factor`` × the window's median (and ``floor``)."""
    ratio = _ratio(series, window)
    fired = not math.isnan(ratio) and ratio > factor and series[-1] > floor
    detail = f"{series[-1]:.4g} is {ratio:.3g}x the median of the last {window} steps"
    return Reading(ratio, fired, detail if fired else "")


def collapse(series: Sequence[float], window: int, ratio: float, floor: float = 0.0) -> Reading:
    """Alarm when the current value falls below ``ratio`` × the window's median (``ratio`` 0:
    off) or below ``floor`` (0: off)."""
    r = _ratio(series, window)
    relative = ratio > 0 and not math.isnan(r) and r < ratio
    absolute = floor > 0 and series[-1] < floor
    if relative:
        detail = f"{series[-1]:.4g} is {r:.3g}x the median of the last {window} steps"
    elif absolute:
        detail = f"{series[-1]:.4g} is below the floor {floor:g}"
    else:
        detail = ""
    return Reading(r, relative or absolute, detail)


def reward_hacking(
    reward: Sequence[float], verifier: Sequence[float], window: int, rise: float, drop: float
) -> Reading:
    """The reward-hacking signature: over the last ``window`` steps the training reward (on the
    verified sample) rises by ≥ ``rise`` while the held-out verifier falls by ≥ ``drop``.
    The statistic is how much the gap between them widened."""
    if min(len(reward), len(verifier)) < window:
        return Reading(NAN, False)
    up, down = fitted_change(reward[-window:]), fitted_change(verifier[-window:])
    fired = up >= rise and down <= -drop
    detail = f"over {window} steps the reward rose {up:+.3f} while the verifier moved {down:+.3f}"
    return Reading(up - down, fired, detail if fired else "")


# monitor name → the metric(s) it reads
METRICS = {
    "kl_spike": ("learner/kl",),
    "entropy_collapse": ("learner/entropy",),
    "length_blowup": ("rollout/length_mean",),
    "reward_hacking": ("reward/verified_reward_mean", "reward/verifier_mean"),
    "reward_std_collapse": ("reward/group_std",),
}


class Monitors:
    """The enabled detectors with their running windows (reset after a rollback)."""

    def __init__(self, cfg: MonitorsConfig):
        self.cfg = cfg
        self.enabled = [name for name in METRICS if self._on(name)]
        self.reset()

    def _on(self, name: str) -> bool:
        c = self.cfg
        return {
            "kl_spike": c.kl_spike > 0,
            "entropy_collapse": c.entropy_collapse > 0 or c.entropy_min > 0,
            "length_blowup": c.length_blowup > 0,
            "reward_hacking": bool(c.verifier_fn),
            "reward_std_collapse": c.reward_std_collapse > 0 or c.reward_std_min > 0,
        }[name]

    def reset(self) -> None:
        size = self.cfg.window + 1
        self.series = {m: deque(maxlen=size) for n in self.enabled for m in METRICS[n]}

    def observe(self, metrics: dict[str, float]) -> dict[str, Reading]:
        """Add a step's metrics to the windows; every enabled detector's reading on them."""
        for metric, series in self.series.items():
            if metric in metrics and math.isfinite(metrics[metric]):
                series.append(float(metrics[metric]))
        return {
            name: self._read(name)
            for name in self.enabled
            # no (finite) data this step: no reading
            if all(math.isfinite(metrics.get(m, NAN)) for m in METRICS[name])
        }

    def _read(self, name: str) -> Reading:
        c, s = self.cfg, {m: list(v) for m, v in self.series.items()}
        if name == "kl_spike":
            return spike(s["learner/kl"], c.window, c.kl_spike, c.kl_floor)
        if name == "entropy_collapse":
            return collapse(s["learner/entropy"], c.window, c.entropy_collapse, c.entropy_min)
        if name == "length_blowup":
            return spike(s["rollout/length_mean"], c.window, c.length_blowup)
        if name == "reward_std_collapse":
            return collapse(
                s["reward/group_std"], c.window, c.reward_std_collapse, c.reward_std_min
            )
        return reward_hacking(
            s["reward/verified_reward_mean"],
            s["reward/verifier_mean"],
            c.window,
            c.hacking_rise,
            c.hacking_drop,
        )
