"""A shortened `brorl compare` (configs/algorithms.yaml): PPO+GAE beside a lagged, uncorrected
GRPO arm, one seed, a few steps, through the real services; it must write results, the table
and the plot, and the lagged arm's paths must be measurably stale."""

import json

import pytest

from brorl.apps.cluster.launcher import REPO_ROOT
from tests.e2e.recipes.conftest import WARMSTART_OVERRIDE

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]

CONFIG = """
base: {demo}
title: shortened comparison
seeds: [0]
steps: 4
eval_points: 2
eval_problems: 50
train_problems: 500
workers: 1
warmstart: {warmstart}
run:
  sampling: {{n: 16}}
  async: {{max_inflight_groups: 4}}
arms:
  ppo_gae: {{train: {{estimator: ppo, ppo: {{epochs: 2, minibatches: 2}}}}}}
  lag2_no_is: {{async: {{publish_lag: 2, max_staleness: 8}}, train: {{off_policy: none}}}}
"""


def test_short_compare_writes_table_and_plot(tmp_path, recipe_command):
    out = tmp_path / "docs"
    config = tmp_path / "compare.yaml"  # arms given in a file: overrides merge into the config's
    demo = REPO_ROOT / "configs" / "demo.yaml"
    config.write_text(CONFIG.format(demo=demo, warmstart=WARMSTART_OVERRIDE))
    recipe_command(["compare", "--config", str(config)], f"out={out}")
    report = json.loads((out / "results.json").read_text())
    runs = {r["arm"]: r for r in report["runs"]}
    assert sorted(runs) == ["lag2_no_is", "ppo_gae"]
    for r in runs.values():
        assert [p["step"] for p in r["curve"]] == [2, 4]
        assert 0.0 <= r["accuracy_final"] <= 1.0 and r["samples_per_s"] > 0
        assert 0.0 <= r["accuracy_equal_wall"] <= 1.0
    # the lagged arm's paths are at least 2 versions old once 2 versions exist (steps 3, 4);
    # steps 1, 2 can only have paths of version 0: staleness 0 and 1
    assert runs["lag2_no_is"]["staleness"] >= (0 + 1 + 2 + 2) / 4
    assert runs["lag2_no_is"]["staleness"] > runs["ppo_gae"]["staleness"]
    assert report["equal_wall_s"] == min(r["wall_s"] for r in runs.values())
    table = (out / "table.md").read_text()
    assert "| ppo_gae |" in table and "| lag2_no_is |" in table
    assert (out / "accuracy.png").stat().st_size > 1000
