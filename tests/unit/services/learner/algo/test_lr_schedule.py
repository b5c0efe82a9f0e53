"""The warm-up's factor on the learning rate, step by step, against a float64 reference."""

from __future__ import annotations

import pytest

from services.learner.algo.lr_schedule import warmup_factor


def reference(done: int, warmup: int) -> float:
    """Step ``done`` (0-based) of a linear ramp that reaches the base rate at step warmup-1."""
    return 1.0 if warmup == 0 else float(min(warmup, done + 1)) / float(warmup)


@pytest.mark.parametrize("warmup", [0, 1, 3, 7, 40])
def test_the_factor_rises_linearly_and_stays_at_one(warmup):
    got = [warmup_factor(k, warmup) for k in range(60)]
    assert got == pytest.approx([reference(k, warmup) for k in range(60)], abs=1e-15)
    assert got[0] == (1.0 if warmup == 0 else 1.0 / warmup)  # the first step is not at lr 0
    assert all(a <= b for a, b in zip(got, got[1:]))
    assert got[max(warmup - 1, 0):] == [1.0] * (60 - max(warmup - 1, 0))


@pytest.mark.parametrize("done,warmup", [(-1, 3), (2, -1)])
def test_negative_counts_are_refused(done, warmup):
    with pytest.raises(ValueError, match="must be >= 0"):
        warmup_factor(done, warmup)
