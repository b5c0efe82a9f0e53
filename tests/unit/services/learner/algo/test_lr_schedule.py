"""The learning-rate schedule's factors (warm-up, decay), step by step, against float64
references."""

from __future__ import annotations

import pytest

import numpy as np

from services.learner.algo.lr_schedule import decay_factor, lr_factor, warmup_factor


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


def decay_reference(done: int, warmup: int, total: int, decay: str, floor: float) -> float:
    """The decay written out: steps warmup .. total-1 map to x = 0 .. 1 (np.linspace), the
    factor is floor + (1 - floor) * shape(x), 1 before, floor after."""
    if decay == "constant" or total - 1 - warmup <= 0 or done <= warmup:
        return 1.0
    if done >= total - 1:
        return floor
    x = np.linspace(0.0, 1.0, total - warmup, dtype=np.float64)[done - warmup]
    shape = 1.0 - x if decay == "linear" else (1.0 + np.cos(np.pi * x)) / 2.0
    return float(floor + (1.0 - floor) * shape)


@pytest.mark.parametrize("decay", ["linear", "cosine"])
@pytest.mark.parametrize("warmup,total,floor", [(0, 2, 0.0), (0, 7, 0.1), (3, 11, 0.25),
                                                (5, 6, 0.5), (9, 9, 0.1), (0, 1, 0.3)])  # fmt: skip
def test_the_decay_falls_from_one_to_the_floor_at_the_last_step(decay, warmup, total, floor):
    got = [decay_factor(k, warmup, total, decay, floor) for k in range(total + 5)]
    want = [decay_reference(k, warmup, total, decay, floor) for k in range(total + 5)]
    assert got == pytest.approx(want, abs=1e-12)
    assert all(a >= b for a, b in zip(got, got[1:]))  # never rises
    if total - 1 > warmup:  # there is a step to decay over
        assert got[warmup] == 1.0 and got[total - 1] == pytest.approx(floor, abs=1e-15)
        assert got[total:] == [got[total - 1]] * 5  # a resumed run past its end stays at floor
    else:
        assert got == [1.0] * len(got)


def test_cosine_is_above_linear_in_the_first_half_and_below_in_the_second():
    lin = [decay_factor(k, 2, 23, "linear", 0.1) for k in range(23)]
    cos = [decay_factor(k, 2, 23, "cosine", 0.1) for k in range(23)]
    mid = 2 + 10  # step 12 of 2..22 is the middle
    assert cos[mid] == pytest.approx(0.55, abs=1e-12) and lin[mid] == pytest.approx(0.55)
    assert all(c > line for c, line in zip(cos[3:mid], lin[3:mid]))
    assert all(c < line for c, line in zip(cos[mid + 1 : 22], lin[mid + 1 : 22]))


def test_constant_is_one_and_the_factor_is_warmup_times_decay():
    assert [decay_factor(k, 3, 10, "constant", 0.0) for k in range(15)] == [1.0] * 15
    for k in range(14):
        want = warmup_factor(k, 4) * decay_factor(k, 4, 12, "cosine", 0.2)
        assert lr_factor(k, 4, 12, "cosine", 0.2) == want


@pytest.mark.parametrize(
    "args,match",
    [((0, 0, 5, "step", 0.1), "decay must be one of"), ((0, 0, 5, "cosine", 1.5), "floor"),
     ((0, 0, 0, "cosine", 0.1), "total >= 1"), ((-1, 0, 5, "linear", 0.1), ">= 0")],
)  # fmt: skip
def test_bad_decay_arguments_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        decay_factor(*args)
