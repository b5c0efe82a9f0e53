"""The arms of `brorl study countdown` (brorl/apps/countdown_study.py): which runs, in which
order, and what each sets — the forks of the plateau keep the saturation run's prompt order."""

from pathlib import Path

import pytest

from brorl.apps import countdown_study, recipe
from brorl.apps.recipe import DemoInputs


def config(**overrides):
    args = [f"{k}={v}" for k, v in overrides.items()]
    return recipe.load_recipe(countdown_study.CountdownStudyConfig,
                              recipe.CONFIGS / "countdown_study.yaml", args)  # fmt: skip


def test_the_plan_has_every_arm_for_every_seed_in_order():
    cfg = config(seeds="[4,5,6]", warm_ns="[16,512]", adaptive_n=32)
    got = [(a["phase"], a["label"], a["n"], a["seed"]) for a in countdown_study.plan(cfg)]
    assert got == [
        ("plateau", "N=16", 16, 5), ("plateau", "N=16", 16, 6),  # seed 4: the continuing run
        ("plateau", "N=512", 512, 4), ("plateau", "N=512", 512, 5), ("plateau", "N=512", 512, 6),
        ("warmstart", "N=16", 16, 4), ("warmstart", "N=16", 16, 5), ("warmstart", "N=16", 16, 6),
        ("warmstart", "N=512", 512, 4), ("warmstart", "N=512", 512, 5),
        ("warmstart", "N=512", 512, 6),
        *[("warmstart", "adaptive 4..512 (mean 32)", 32, s) for s in (4, 5, 6)],
    ]  # fmt: skip
    adaptive = countdown_study.plan(cfg)[-1]["budget"]
    assert adaptive == {"kind": "adaptive", "total": 32 * 8, "n_min": 4, "n_max": 512}
    assert countdown_study.plan(config(phases="[warmstart]", adaptive_n=0))[0]["phase"] == (
        "warmstart"
    )


def test_a_fork_keeps_the_saturation_runs_prompt_order_and_a_warm_arm_takes_its_seed(tmp_path):
    cfg = config(seeds="[3,7]")
    inputs = DemoInputs(tmp_path, tmp_path / "train.jsonl", 0.1)
    probes = Path(tmp_path / "probes.jsonl")
    for arm in countdown_study.plan(cfg):
        rc = countdown_study.arm_config(cfg, inputs, probes, arm["n"], arm["seed"],
                                        countdown_study.arm_extra(cfg, arm))  # fmt: skip
        assert rc.sampling.n == arm["n"] and rc.train.seed == arm["seed"]
        want = 3 if arm["phase"] == "plateau" else arm["seed"]
        assert rc.data.shuffle_seed == want, arm
        assert rc.probe.every == 1 and rc.checkpoint_every == 0 and rc.eval_every == 0
        assert (rc.sampling.budget.kind == "adaptive") == ("adaptive" in arm["label"])


def test_the_study_refuses_another_task_naming_the_setting():
    from brorl.errors import InvalidArgument

    cfg = config(task="addition")
    with pytest.raises(InvalidArgument, match="`brorl study countdown` runs the countdown task"):
        recipe.require_task(cfg, "countdown", "study countdown")
    recipe.require_task(config(), "countdown", "study countdown")  # its own config passes


def test_the_study_keeps_its_own_prompts_and_temperature_whatever_the_demo_recipe_sets(tmp_path):
    # configs/countdown.yaml may train on easy prompts at another temperature; the study's
    # results were measured on prompts of every label (the hard ones are its subject) at
    # temperature 1, and its config says so itself rather than inheriting the demo's choice
    cfg = config()
    assert cfg.train_labels == []
    inputs = DemoInputs(tmp_path, tmp_path / "train.jsonl", 0.1)
    rc = countdown_study.arm_config(cfg, inputs, tmp_path / "probes.jsonl", 16, 0)
    assert rc.sampling.temperature == 1.0
    train = rc.train
    assert (train.groups_per_step, train.lr, train.lr_warmup_steps, train.lr_decay) == (
        8, 5e-4, 0, "constant"
    )
