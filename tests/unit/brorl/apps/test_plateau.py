"""The plateau rule (services/learner/plateau.py) on synthetic accuracy curves."""

import math
import random

import pytest

from brorl.apps.plateau import plateau_reached, plateau_start, rise_after


def test_flat_after_rising_is_a_plateau_starting_where_it_flattened():
    curve = [0.1, 0.2, 0.3, 0.4, 0.5] + [0.5] * 6  # rises to index 4, flat from index 5
    assert plateau_reached(curve, window=3, min_gain=0.01)
    # the first prefix that fails to improve is curve[:8]: its window starts at index 5
    assert plateau_start(curve, window=3, min_gain=0.01) == 5


def test_noisy_flat_is_a_plateau():
    rng = random.Random(0)
    rising = [0.1 * i for i in range(6)]  # 0.0 .. 0.5
    noisy = [0.5 + rng.uniform(-0.02, 0.02) for _ in range(20)]
    assert plateau_reached(rising + noisy, window=5, min_gain=0.03)
    start = plateau_start(rising + noisy, window=5, min_gain=0.03)
    assert start is not None and 6 <= start <= 8


def test_rising_curve_is_not_a_plateau():
    curve = [0.05 * i for i in range(20)]  # +0.05 per evaluation
    assert not plateau_reached(curve, window=3, min_gain=0.05)
    assert plateau_start(curve, window=3, min_gain=0.05) is None


def test_slow_steady_rise_below_min_gain_per_window_counts_as_plateau():
    # By design: the rule measures progress per window, not the sign of the slope. +0.001 per
    # evaluation is +0.004 per 4-evaluation window, below min_gain = 0.01 -> plateau.
    curve = [0.5 + 0.001 * i for i in range(30)]
    assert plateau_reached(curve, window=4, min_gain=0.01)
    # plateaued from the first possible prefix: its window starts at index 1 (index 0 is "before")
    assert plateau_start(curve, window=4, min_gain=0.01) == 1
    # same curve, min_gain below the per-window gain -> still improving
    assert not plateau_reached(curve, window=4, min_gain=0.003)


def test_gain_of_exactly_min_gain_is_a_plateau_and_just_above_is_not():
    assert plateau_reached([0.0, 0.25], window=1, min_gain=0.25)
    assert not plateau_reached([0.0, 0.25], window=1, min_gain=0.2)


def test_recent_best_is_the_window_max_not_the_last_value():
    # a peak inside the window still counts as progress, even if the last value fell back
    assert not plateau_reached([0.1, 0.5, 0.7, 0.4], window=2, min_gain=0.1)


def test_drop_is_a_plateau():
    assert plateau_reached([0.2, 0.6, 0.5, 0.4], window=2, min_gain=0.0)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_fewer_than_window_plus_one_values_is_never_a_plateau(n):
    curve = [0.5] * n
    assert not plateau_reached(curve, window=3, min_gain=0.1)
    assert plateau_start(curve, window=3, min_gain=0.1) is None
    assert plateau_reached([0.5] * 4, window=3, min_gain=0.1)  # window + 1 values: enough


def test_window_one_compares_last_value_with_best_before():
    assert plateau_reached([0.1, 0.4, 0.4], window=1, min_gain=0.0)
    assert not plateau_reached([0.1, 0.4, 0.41], window=1, min_gain=0.0)
    # an earlier peak counts: the last value must beat the best before it, not its neighbour
    assert plateau_reached([0.1, 0.6, 0.3, 0.5], window=1, min_gain=0.05)
    assert plateau_start([0.1, 0.6, 0.3, 0.5], window=1, min_gain=0.05) == 2


def test_a_broken_plateau_is_not_reported_only_the_one_in_effect():
    curve = [0.1, 0.3, 0.3, 0.3, 0.6, 0.6, 0.6]  # flat at 1..3, jump at 4, flat again
    assert plateau_reached(curve, window=2, min_gain=0.01)
    assert plateau_start(curve, window=2, min_gain=0.01) == 5
    assert not plateau_reached(curve[:5], window=2, min_gain=0.01)  # the jump broke it


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_rejected(bad):
    with pytest.raises(ValueError, match="finite"):
        plateau_reached([0.1, bad, 0.3], window=1, min_gain=0.0)
    with pytest.raises(ValueError, match="finite"):
        plateau_start([0.1, 0.2, bad], window=1, min_gain=0.0)


@pytest.mark.parametrize("window,min_gain", [(0, 0.1), (-1, 0.1), (2.0, 0.1), (2, -0.1)])
def test_bad_window_or_min_gain_is_rejected(window, min_gain):
    with pytest.raises(ValueError):
        plateau_reached([0.1, 0.2, 0.3], window=window, min_gain=min_gain)


def test_plateau_start_agrees_with_plateau_reached_on_every_prefix():
    rng = random.Random(1)
    curve = [min(1.0, 0.05 * i) + rng.uniform(-0.03, 0.03) for i in range(40)]
    for e in range(len(curve)):
        prefix = curve[: e + 1]
        reached = plateau_reached(prefix, window=4, min_gain=0.02)
        assert (plateau_start(prefix, window=4, min_gain=0.02) is not None) == reached


def test_rise_after_is_the_later_best_over_the_earlier_best():
    before, after = [0.12, 0.15, 0.12, 0.143, 0.147, 0.133], [0.17, 0.143, 0.137, 0.14]
    assert rise_after(before, after) == pytest.approx(0.02)  # 0.17 - 0.15: broken at 1 point
    assert rise_after(before, [0.149, 0.10]) == pytest.approx(-0.001)  # held, below the best
    assert rise_after([0.3], [0.2, 0.31, 0.25]) == pytest.approx(0.01)  # the best, not the last
    # held iff the rule called on before + each later value would still call it flat
    rng = random.Random(1)
    for _ in range(200):
        b = [rng.uniform(0, 1) for _ in range(rng.randint(1, 7))]
        a = [rng.uniform(0, 1) for _ in range(rng.randint(1, 5))]
        g = rng.choice([0.0, 0.01, 0.05])
        held = all(plateau_reached(b + [x], window=1, min_gain=g) for x in a)
        assert (rise_after(b, a) <= g) == held


@pytest.mark.parametrize("before, after", [([], [0.1]), ([0.1], []), ([0.1], [math.nan])])
def test_rise_after_refuses_empty_or_non_finite(before, after):
    with pytest.raises(ValueError):
        rise_after(before, after)
