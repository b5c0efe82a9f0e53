"""When a held-out accuracy curve has stopped improving (pure Python, no torch).

BroRL's claim is that widening the sampling (more paths per prompt) moves the point where
accuracy plateaus. To test that, a run must decide *when* it has plateaued with one rule that
every run shares; this module is that rule, so two studies cannot disagree on it.

The rule, exactly. Let ``v[0..N-1]`` be the curve (one value per evaluation, in order), ``w``
the window and ``g`` the minimum gain. The curve has plateaued at its end iff

    N >= w + 1   and   max(v[N-w:]) - max(v[:N-w]) <= g

i.e. the best of the last ``w`` evaluations beats the best of everything before them by at
most ``g`` (a gain of exactly ``g`` still counts as a plateau). Consequences, stated so no one
is surprised:

* A curve that still rises, but by no more than ``g`` over any ``w`` evaluations, *is* a
  plateau: the rule measures progress per window, not the sign of the slope.
* A drop is a plateau (the recent best is below the earlier best; the difference is < 0).
* With fewer than ``w + 1`` values there is nothing "before" the window: never a plateau.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _check(values: Sequence[float], window: int, min_gain: float) -> list[float]:
    """The curve as floats, after rejecting what would make the rule meaningless: NaN or inf
    (max() over NaN depends on its position), window < 1, negative or non-finite min_gain."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    if not math.isfinite(min_gain) or min_gain < 0:
        raise ValueError(f"min_gain must be finite and >= 0, got {min_gain!r}")
    curve = [float(v) for v in values]
    for i, v in enumerate(curve):
        if not math.isfinite(v):
            raise ValueError(f"values[{i}] is {v!r}: the curve must be finite (no NaN/inf)")
    return curve


def _plateaued_prefixes(curve: list[float], window: int, min_gain: float) -> list[bool]:
    """flat[e] (len N): whether the prefix curve[:e+1] has plateaued by the rule above.

    O(N * window) with plain max(); eval curves are short (hundreds of points)."""
    flat = [False] * len(curve)
    best_before = -math.inf  # max(curve[:e+1-window]), grown one value per e
    for e in range(window, len(curve)):
        best_before = max(best_before, curve[e - window])
        best_recent = max(curve[e + 1 - window : e + 1])
        flat[e] = best_recent - best_before <= min_gain
    return flat


def plateau_reached(values: Sequence[float], window: int, min_gain: float) -> bool:
    """Whether the curve has plateaued at its last value (rule: module docstring).

    values: one held-out accuracy per evaluation, oldest first. window: evaluations in the
    recent window (>= 1). min_gain: accuracy units; the recent best must beat the earlier best
    by strictly more than this for the curve to count as still improving.
    Raises ValueError on NaN/inf values or bad window/min_gain; False when len < window + 1."""
    curve = _check(values, window, min_gain)
    if len(curve) < window + 1:
        return False
    n = len(curve)
    return max(curve[n - window :]) - max(curve[: n - window]) <= min_gain


def plateau_start(values: Sequence[float], window: int, min_gain: float) -> int | None:
    """Index of the first evaluation of the plateau in effect at the end, or None if there is
    none (``plateau_reached`` is False).

    The plateau in effect is the longest unbroken run of prefixes ``values[:e+1]`` ending at
    the last value that are all plateaued; if ``e0`` is the first prefix end of that run, the
    plateau began at ``e0 + 1 - window``: the first of the ``window`` evaluations that failed
    to improve. A later rise by more than ``min_gain`` breaks a plateau, so an earlier one that
    was broken is not reported (a study wants when the run *last* stopped improving)."""
    curve = _check(values, window, min_gain)
    flat = _plateaued_prefixes(curve, window, min_gain)
    if not flat or not flat[-1]:
        return None
    e0 = len(flat) - 1
    while e0 - 1 >= 0 and flat[e0 - 1]:
        e0 -= 1
    return e0 + 1 - window


def rise_after(before: Sequence[float], after: Sequence[float]) -> float:
    """How far the evaluations ``after`` a plateau was called rose above it: the best of
    ``after`` minus the best of ``before`` (the curve up to and including the plateau step).

    The plateau *held* through the later window iff this is <= the rule's ``min_gain`` (the
    rule's own test, with the later window as "recent"); negative when every later evaluation
    is below the earlier best. Both must be non-empty and finite (ValueError otherwise)."""
    if not before or not after:
        raise ValueError("before and after must both hold at least one evaluation")
    b, a = _check(before, 1, 0.0), _check(after, 1, 0.0)
    return max(a) - max(b)
