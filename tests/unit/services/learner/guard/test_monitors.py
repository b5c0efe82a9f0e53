"""The monitors' detectors on synthetic metric series: each fires on its pattern and stays quiet
on a normal noisy curve (services/learner/guard/monitors.py)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from brorl.config.monitors import MonitorsConfig
from services.learner.guard import monitors as m


def noisy(n: int, start: float, end: float, rel_noise: float, seed: int) -> list[float]:
    """A smooth trend from start to end with multiplicative log-normal noise."""
    rng = random.Random(seed)
    return [
        (start + (end - start) * i / max(n - 1, 1)) * math.exp(rng.gauss(0, rel_noise))
        for i in range(n)
    ]


def fires_at(detector, series: list[float]) -> list[int]:
    """Steps at which ``detector`` alarms when fed the series one step at a time."""
    return [i for i in range(len(series)) if detector(series[: i + 1]).fired]


# -- helpers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 7, 12])
def test_fitted_change_matches_numpy_polyfit(n):
    ys = [math.sin(i * 1.7) + 0.3 * i for i in range(n)]
    slope = np.polyfit(np.arange(n, dtype=np.float64), np.array(ys, dtype=np.float64), 1)[0]
    assert m.fitted_change(ys) == pytest.approx(slope * (n - 1), rel=1e-12, abs=1e-12)


def test_median_of_odd_and_even_windows():
    assert m.median([5, 1, 3]) == 3
    assert m.median([4, 1, 3, 2]) == 2.5


# -- KL spike --------------------------------------------------------------------------------
def kl(series):
    return m.spike(series, window=8, factor=3.0, floor=1e-3)


def test_kl_spike_quiet_on_a_noisy_rising_kl():
    for seed in range(20):
        assert fires_at(kl, noisy(200, 0.005, 0.05, 0.25, seed)) == []


def test_kl_spike_fires_on_a_jump():
    series = noisy(60, 0.01, 0.012, 0.2, seed=1)
    series[40] = 0.06  # about 5x its neighbours
    assert fires_at(kl, series) == [40]


def test_kl_spike_baseline_is_not_inflated_by_an_earlier_spike():
    # a mean baseline would absorb the first spike and miss the second (4x) one
    series = [0.01] * 20
    series[10], series[12] = 0.05, 0.04
    assert fires_at(kl, series) == [10, 12]


def test_kl_spike_needs_a_full_window_and_the_floor():
    assert not kl([0.01] * 3 + [1.0]).fired  # window of 8 not full yet
    assert math.isnan(kl([0.01] * 3 + [1.0]).value)
    # the baseline is the steps BEFORE the current one (with it, a 2-step window halves a spike)
    assert m.spike([0.01, 0.01, 0.05], window=2, factor=3.0).value == pytest.approx(5.0)
    tiny = [1e-6] * 10 + [1e-4]  # 100x, but below the 1e-3 floor
    assert not kl(tiny).fired


# -- entropy collapse -------------------------------------------------------------------------
def entropy(series):
    return m.collapse(series, window=8, ratio=0.5, floor=0.05)


def test_entropy_collapse_quiet_on_a_slow_noisy_decline():
    for seed in range(20):
        assert fires_at(entropy, noisy(200, 1.2, 0.4, 0.1, seed)) == []


def test_entropy_collapse_fires_on_a_sudden_drop_and_below_the_floor():
    series = noisy(40, 1.0, 0.9, 0.1, seed=3) + [0.3]
    assert fires_at(entropy, series) == [40]
    # the floor alone (ratio 0: off) needs no window: a slide fires once it passes 0.05
    slide = [1.0 * 0.8**i for i in range(16)]
    first = next(i for i, v in enumerate(slide) if v < 0.05)
    floor_only = lambda s: m.collapse(s, window=8, ratio=0.0, floor=0.05)  # noqa: E731
    assert fires_at(floor_only, slide) == list(range(first, 16))
    assert fires_at(floor_only, slide[:3]) == []


# -- response-length blow-up -----------------------------------------------------------------
def length(series):
    return m.spike(series, window=8, factor=2.0)


def test_length_blowup_quiet_on_noisy_lengths_fires_on_a_blowup():
    for seed in range(20):
        assert fires_at(length, noisy(150, 5.0, 7.0, 0.15, seed)) == []
    series = noisy(30, 5.0, 5.0, 0.1, seed=4) + [16.0, 16.0]
    assert fires_at(length, series)[:1] == [30]


# -- reward variance collapse ---------------------------------------------------------------
def reward_std(series):
    return m.collapse(series, window=8, ratio=0.3, floor=0.0)


def test_reward_std_collapse():
    for seed in range(20):
        assert fires_at(reward_std, noisy(150, 0.45, 0.35, 0.15, seed)) == []
    series = noisy(30, 0.45, 0.45, 0.1, seed=5) + [0.05]
    assert fires_at(reward_std, series) == [30]


# -- reward hacking --------------------------------------------------------------------------
def hacking(reward, verifier):
    return m.reward_hacking(reward, verifier, window=6, rise=0.1, drop=0.05)


def fires_on_pair(reward, verifier):
    return [i for i in range(len(reward)) if hacking(reward[: i + 1], verifier[: i + 1]).fired]


def jitter(values, scale, seed):
    rng = random.Random(seed)
    return [v + rng.gauss(0, scale) for v in values]


def test_reward_hacking_fires_when_reward_rises_and_the_verifier_falls():
    # 10 honest steps (both flat), then the policy games the reward: reward up, verifier down
    reward = [0.3] * 10 + [0.3 + 0.08 * k for k in range(1, 9)]
    verifier = [0.3] * 10 + [0.3 - 0.04 * k for k in range(1, 9)]
    steps = fires_on_pair(jitter(reward, 0.01, 1), jitter(verifier, 0.01, 2))
    assert steps and 11 <= steps[0] <= 14  # within a few steps of the hack's start


def test_reward_hacking_quiet_when_both_rise_or_on_noise():
    for seed in range(20):
        # honest learning: the reward and the verifier rise together
        reward = jitter([0.2 + 0.02 * i for i in range(60)], 0.03, seed)
        verifier = jitter([0.2 + 0.018 * i for i in range(60)], 0.03, seed + 100)
        assert fires_on_pair(reward, verifier) == []
        # a plateau with noise on both
        flat_r, flat_v = jitter([0.5] * 60, 0.03, seed + 200), jitter([0.5] * 60, 0.03, seed + 300)
        assert fires_on_pair(flat_r, flat_v) == []


def test_reward_hacking_needs_both_halves_of_the_signature():
    falling = [0.5 - 0.05 * i for i in range(8)]
    rising = [0.2 + 0.05 * i for i in range(8)]
    flat = [0.5] * 8
    assert not hacking(flat, falling).fired  # the verifier falls, the reward does not rise
    assert not hacking(rising, flat).fired  # the reward rises, the verifier holds
    r = hacking(rising, falling)
    assert r.fired and r.value == pytest.approx(0.25 + 0.25)  # over the last 6 steps


# -- the windowed runner ---------------------------------------------------------------------
def test_monitors_run_enabled_detectors_on_step_metrics():
    cfg = MonitorsConfig(window=4, kl_spike=3.0, verifier_fn="exact")
    mon = m.Monitors(cfg)
    assert mon.enabled == ["kl_spike", "reward_hacking"]  # thresholds 0: off
    for _ in range(4):
        readings = mon.observe({"learner/kl": 0.01, "learner/entropy": 1.0})
        assert set(readings) == {"kl_spike"}  # no verifier metrics: no hacking reading
        assert not readings["kl_spike"].fired
    assert mon.observe({"learner/kl": 0.05})["kl_spike"].fired
    mon.reset()  # after a rollback the window starts afresh
    assert not mon.observe({"learner/kl": 0.05})["kl_spike"].fired
    assert mon.observe({"learner/kl": float("nan")}) == {}
