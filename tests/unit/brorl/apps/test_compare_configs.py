"""Every `brorl compare` config's arms make valid run configs: a typo in an arm would otherwise
surface only when the comparison reaches that arm, minutes into it (brorl/apps/compare_cmd.py
validates an arm's run config as it starts the run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brorl.apps import recipe
from brorl.apps.compare_cmd import CompareConfig

COMPARES = ["algorithms.yaml", "staleness.yaml", "keep_paths.yaml"]
INPUTS = recipe.DemoInputs(model=Path("/m"), data=Path("/d.jsonl"), accuracy=0.1)


def arm_configs(name: str) -> dict:
    cfg = recipe.load_recipe(CompareConfig, recipe.CONFIGS / name)
    return {arm: recipe.build_run_config(cfg, INPUTS, o) for arm, o in cfg.arms.items()}


@pytest.mark.parametrize("name", COMPARES)
def test_every_arm_makes_a_valid_run_config(name):
    runs = arm_configs(name)
    assert len(runs) >= 2


def test_the_keep_paths_arms_sample_alike_and_train_on_what_they_say():
    runs = arm_configs("keep_paths.yaml")
    assert {r.sampling.n for r in runs.values()} == {512}
    kept = {arm: (r.train.keep_paths, r.train.keep_rule) for arm, r in runs.items()}
    assert kept == {
        "all_512": (0, "max_variance"),
        "max_variance_64": (64, "max_variance"),
        "random_64": (64, "random"),
    }


def test_an_arm_with_an_unknown_key_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"base: {recipe.CONFIGS / 'demo.yaml'}\narms:\n  a: {{train: {{keep_path: 4}}}}\n"
    )
    cfg = recipe.load_recipe(CompareConfig, bad)
    with pytest.raises(Exception, match="keep_path"):
        recipe.build_run_config(cfg, INPUTS, cfg.arms["a"])
