"""brorl/config/schedule.py: temperatures at and around every boundary, config parsing and
validation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from brorl.config import schedule as sch

ROOT = Path(__file__).resolve().parents[4]


def test_constant():
    s = sch.constant(0.8)
    assert [s(k) for k in (0, 1, 10**9)] == [0.8, 0.8, 0.8]
    assert sch.temperature_at({"kind": "constant", "t": 1.0}, 123) == 1.0


@pytest.mark.parametrize(
    "step,expected",
    [(0, 1.3), (999, 1.3), (1000, 0.9), (1001, 0.9), (2999, 0.9), (3000, 0.7), (10**7, 0.7)],
)
def test_staged_at_each_boundary(step, expected):
    cfg = {"kind": "staged", "bounds": [1000, 3000], "temps": [1.3, 0.9, 0.7]}
    assert sch.temperature_at(cfg, step) == expected
    assert sch.staged()(step) == expected  # the defaults are the same schedule


def test_staged_single_and_many_stages():
    assert [sch.staged((), (0.9,))(k) for k in (0, 5)] == [0.9, 0.9]
    s = sch.staged([1, 2, 3], [4.0, 3.0, 2.0, 1.0])
    assert [s(k) for k in range(5)] == [4.0, 3.0, 2.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "bounds,temps",
    [
        ((1000, 3000), (1.3, 0.9)),
        ((1000,), (1.3, 0.9, 0.7)),
        ((3000, 1000), (1.3, 0.9, 0.7)),
        ((1000, 1000), (1.3, 0.9, 0.7)),
        ((-1,), (1.0, 0.9)),
        ((1.5,), (1.0, 0.9)),
        ((10,), (1.0, 0.0)),
        ((10,), (1.0, float("nan"))),
    ],
)
def test_staged_rejects_bad_stages(bounds, temps):
    with pytest.raises(ValueError):
        sch.staged(bounds, temps)


def test_linear():
    s = sch.linear(1.2, 0.7, steps=2000)
    assert s(0) == 1.2 and s(2000) == 0.7 and s(5000) == 0.7
    assert s(1000) == pytest.approx(0.95) and s(500) == pytest.approx(1.075)
    assert all(s(k) >= s(k + 1) for k in range(0, 2100, 7))
    up = sch.temperature_at({"kind": "linear", "t0": 0.5, "t1": 1.5, "steps": 4}, 1)
    assert up == pytest.approx(0.75)
    for bad in (dict(steps=0), dict(steps=2.5), dict(t0=-1.0), dict(t1=float("inf"))):
        with pytest.raises(ValueError):
            sch.linear(**bad)


def test_config_errors_and_steps():
    with pytest.raises(ValueError, match="constant, staged, linear"):
        sch.temperature_at({"kind": "cosine"}, 0)
    with pytest.raises(ValueError, match="valid kinds"):
        sch.temperature_at({"t": 1.0}, 0)
    with pytest.raises(ValueError, match="unknown parameter"):
        sch.temperature_at({"kind": "constant", "temp": 1.0}, 0)
    with pytest.raises(ValueError, match="step"):
        sch.temperature_at({"kind": "constant", "t": 1.0}, -1)
    with pytest.raises(ValueError):
        sch.temperature_at([("kind", "constant")], 0)
    assert sch.from_config({"kind": "staged"}) == sch.staged()
    assert sch.temperature_at({"kind": "linear", "steps": 10}, 10) == 0.7


def test_schedule_is_pure_python():
    code = (
        "import sys, brorl.config.schedule\n"
        "print(any(m in sys.modules for m in ('numpy', 'torch')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
