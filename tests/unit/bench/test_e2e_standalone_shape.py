"""The standalone update bench/e2e.py compares the pipeline's learner with has the run's shape; the
steady rate leaves out the pipeline's fill."""

from __future__ import annotations

import pytest

from bench.e2e import completion_range, steady_rate


@pytest.mark.parametrize(
    "mean,padded,expected",
    [
        (3.42, 4.07, (3, 4)),  # demo_fast after a few steps: short answers, padded to 4
        (41.5, 49.0, (34, 49)),  # the long shape
        (5.9, 6.0, (6, 6)),
        (1.0, 1.0, (1, 1)),
        (1.2, 9.0, (1, 9)),  # a mean below half the padded length: the shortest is 1
    ],
)
def test_completion_range_has_the_runs_padded_length_and_about_its_mean(mean, padded, expected):
    lo, hi = completion_range(mean, padded)
    assert (lo, hi) == expected
    assert 1 <= lo <= hi == round(padded)
    if lo > 1:  # lengths drawn uniformly from lo..hi average the run's mean
        assert abs((lo + hi) / 2 - mean) <= 0.5


def test_the_steady_rate_leaves_out_the_first_steps_fill():
    # the first step waits 3 s for its groups; then 100 paths every 0.5 s, one step 130
    times = [3.5, 4.0, 4.5, 5.25]
    generated = [100.0, 200.0, 300.0, 430.0]
    assert steady_rate(times, generated, whole=430 / 5.25) == pytest.approx(330 / 1.75)
    assert steady_rate(times[:1], generated[:1], whole=7.0) == 7.0  # one step: the whole run's
    assert steady_rate([2.0, 2.0], [5.0, 9.0], whole=3.0) == 3.0  # no time between the steps
