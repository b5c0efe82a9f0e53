"""The standalone update bench/e2e.py compares the pipeline's learner with has the run's shape."""

from __future__ import annotations

import pytest

from bench.e2e import completion_range


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
