from pathlib import Path

import pytest
from pydantic import Field

from brorl.config.base import StrictModel, load_config
from brorl.errors import InvalidArgument
from brorl.config.run import parse_run_config


class Inner(StrictModel):
    x: int = Field(1, ge=0)
    name: str = "a"


class Outer(StrictModel):
    inner: Inner = Inner()
    lr: float = 1e-3


def test_precedence_defaults_file_env_cli(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.5\ninner: {x: 2, name: file}\n")
    cfg = load_config(
        Outer, f, ["inner.x=7"], environ={"BRORL_INNER__NAME": "env", "BRORL_INNER__X": "3"}
    )
    assert (cfg.lr, cfg.inner.x, cfg.inner.name) == (0.5, 7, "env")
    assert load_config(Outer, None, [], environ={}).lr == 1e-3


def test_unknown_key_is_rejected_with_its_name():
    with pytest.raises(InvalidArgument) as err:
        load_config(Outer, None, ["inner.typo=1"], environ={})
    assert err.value.field == "inner.typo"
    assert "unknown key" in str(err.value)


def test_range_violation_names_the_field():
    with pytest.raises(InvalidArgument) as err:
        load_config(Outer, None, ["inner.x=-1"], environ={})
    assert err.value.field == "inner.x"


def test_run_config_errors_name_fields():
    ok = parse_run_config("model: m\ndata: {train_path: d.jsonl}\nasync: {max_staleness: 1}")
    assert ok.asynchrony.max_staleness == 1 and ok.sampling.n == 512
    for text, field in [
        ("model: m", "data"),
        ("model: m\ndata: {train_path: d}\nsampling: {n: 0}", "sampling.n"),
        ("model: m\ndata: {train_path: d}\ntrain: {lr: -1}", "train.lr"),
        ("- a\n- b", "config_yaml"),
        ("model: [unclosed", "config_yaml"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            parse_run_config(text)
        assert err.value.field == field, (text, str(err.value))


# --- the recipe shared by `brorl demo` and `brorl sweep` (brorl/apps/recipe.py) -----------------


def test_sweep_follows_the_demo_recipe():
    from pathlib import Path

    from brorl.apps.demo_cmd import DEFAULT_CONFIG, DemoConfig
    from brorl.apps.recipe import (
        CONFIGS,
        DemoInputs,
        build_run_config,
        load_recipe,
        run_config_yaml,
    )
    from brorl.apps.sweep_cmd import SweepConfig, per_run_config, plan

    demo = load_recipe(DemoConfig, DEFAULT_CONFIG)
    sweep = load_recipe(
        SweepConfig, CONFIGS / "sweep.yaml", ["workers=1", "warmstart=[--steps,150]", "ns=[16,64]"]
    )
    assert (
        sweep.base == "demo.yaml"
        and sweep.run == demo.run
        and sweep.threads_per_process == demo.threads_per_process
    )
    assert (demo.eval_problems, sweep.eval_problems, sweep.workers, sweep.warmstart) == (
        500,
        200,
        1,
        ["--steps", "150"],
    )

    inputs = DemoInputs(model=Path("/m"), data=Path("/d.jsonl"), accuracy=0.1)
    demo_run = build_run_config(demo, inputs)
    assert (demo_run.model, demo_run.data.train_path, demo_run.sampling.n) == (
        "/m",
        "/d.jsonl",
        512,
    )
    assert parse_run_config(run_config_yaml(demo_run)) == demo_run
    runs = plan(sweep)
    assert [(r["regime"], r["n"], r["steps"]) for r in runs[::3]] == [
        ("equal_steps", 16, 10),
        ("equal_steps", 64, 10),
        ("equal_samples", 16, 320),
        ("equal_samples", 64, 80),
    ]
    sweep_run = build_run_config(sweep, inputs, per_run_config(runs[-1]))
    assert (
        sweep_run.sampling.n,
        sweep_run.train.steps,
        sweep_run.train.seed,
        sweep_run.data.shuffle_seed,
    ) == (64, 80, 2, 2)
    # everything the sweep does not set per run is the demo's
    same = build_run_config(
        demo,
        inputs,
        {"sampling": {"n": 64}, "train": {"steps": 80, "seed": 2}, "data": {"shuffle_seed": 2}},
    )
    assert sweep_run == same


def test_recipe_bases_are_checked(tmp_path):
    from brorl.apps.demo_cmd import DemoConfig
    from brorl.apps.recipe import load_recipe

    (tmp_path / "a.yaml").write_text("base: b.yaml\nworkers: 3\n")
    (tmp_path / "b.yaml").write_text("workers: 1\nrun: {reward_fn: exact_match}\n")
    cfg = load_recipe(DemoConfig, tmp_path / "a.yaml")
    assert (cfg.workers, cfg.run) == (3, {"reward_fn": "exact_match"})
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    for path, overrides, field in [
        (tmp_path / "a.yaml", [], "base"),
        (tmp_path / "missing.yaml", [], "config"),
        (tmp_path / "b.yaml", ["base=c.yaml"], "base"),
        (tmp_path / "c.yaml", [], "config"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            load_recipe(DemoConfig, path, overrides)
        assert err.value.field == field, (path, str(err.value))
    (tmp_path / "c.yaml").write_text("workers: 1\neval_problems: 100\n")  # the demo needs >= 200
    with pytest.raises(InvalidArgument) as err:
        load_recipe(DemoConfig, tmp_path / "c.yaml")
    assert err.value.field == "eval_problems"


def test_the_fast_demo_recipe_narrows_groups_over_the_demo():
    from brorl.apps.demo_cmd import DemoConfig
    from brorl.apps.recipe import CONFIGS, DemoInputs, build_run_config, load_recipe

    inputs = DemoInputs(model=Path("/m"), data=Path("/d.jsonl"), accuracy=0.1)
    demo = build_run_config(load_recipe(DemoConfig, CONFIGS / "demo.yaml"), inputs)
    fast = build_run_config(load_recipe(DemoConfig, CONFIGS / "demo_fast.yaml"), inputs)
    assert (fast.sampling.n, fast.train.groups_per_step) == (64, 8)
    # half of its groups are all-equal and dropped: a step consumes ≈ 2 × groups_per_step, and
    # two steps of that in flight keep its worker busy
    assert fast.asynchrony.max_inflight_groups >= 4 * fast.train.groups_per_step
    # everything else is the demo's recipe
    assert fast.reward_fn == demo.reward_fn and fast.train.lr == demo.train.lr
    assert fast.sampling.max_tokens == demo.sampling.max_tokens


def test_recipe_learner_overrides_reach_the_learner_command(tmp_path):
    from brorl.apps.demo_cmd import DEFAULT_CONFIG, DemoConfig
    from brorl.apps.recipe import DemoInputs, cluster_spec, load_recipe

    cfg = load_recipe(DemoConfig, DEFAULT_CONFIG, ["learner.torch_threads=2", "learner_ranks=2"])
    inputs = DemoInputs(model=tmp_path / "m", data=tmp_path / "d.jsonl", accuracy=0.1)
    common = dict(redis_url="redis://127.0.0.1:1/0", reward_port=1, learner_port=2)
    spec = cluster_spec(cfg, inputs, tmp_path, rollout_base_port=3, namespace="t", **common)
    assert spec.learner_overrides == {"ranks": 2, "torch_threads": 2}
    # the command's own settings (e.g. a study keeping every version) come last
    spec = cluster_spec(
        cfg,
        inputs,
        tmp_path,
        rollout_base_port=3,
        namespace="t",
        learner_overrides={"torch_threads": 1, "keep_weight_versions": 9},
        **common,
    )
    assert spec.learner_overrides == {"ranks": 2, "torch_threads": 1, "keep_weight_versions": 9}
