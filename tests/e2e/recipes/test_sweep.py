"""A shortened `brorl sweep`: two group sizes, one seed, a few steps, through the real services;
it must write results, the table and the plots."""

import json

import pytest

from tests.e2e.recipes.conftest import WARMSTART_OVERRIDE

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


def test_short_sweep_writes_table_and_plots(tmp_path, recipe_command):
    out = tmp_path / "docs"
    recipe_command(
        ["sweep"],
        "ns=[16,64]", "seeds=[0]", "equal_steps=2", "sample_budget=256", "eval_problems=50",
        "eval_points=1", "train_problems=500", "workers=1",
        f"warmstart={WARMSTART_OVERRIDE}", f"out={out}",
    )  # fmt: skip
    report = json.loads((out / "results.json").read_text())
    assert [(r["regime"], r["n"], r["steps"]) for r in report["runs"]] == [
        ("equal_steps", 16, 2),
        ("equal_steps", 64, 2),
        ("equal_samples", 16, 4),
        ("equal_samples", 64, 1),
    ]
    # configs/sweep.yaml trains on 4 groups per step; skipped all-equal groups add to what is
    # generated
    assert all(
        0.0 <= r["accuracy_final"] <= 1.0 and r["generated"] >= 4 * r["n"] * r["steps"]
        for r in report["runs"]
    )
    table = (out / "table.md").read_text()
    assert "| equal_samples | 16 | 4 |" in table  # 256 paths / (16 x 4 groups per step)
    for name in ("accuracy_equal_samples.png", "accuracy_equal_steps.png", "gradient_spread.png"):
        assert (out / name).stat().st_size > 1000
