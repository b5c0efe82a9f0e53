"""`brorl study broaden` without a cluster: its plan of runs, evaluation points, and the tables
and plots it writes from a results report (synthetic numbers, shape only)."""

from brorl.apps import recipe, study_cmd, study_report


def config(**overrides):
    args = [f"{k}={v}" for k, v in overrides.items()]
    return recipe.load_recipe(study_cmd.BroadenConfig, recipe.CONFIGS / "broaden.yaml", args)


def test_plan_has_every_regime_arm_and_seed():
    cfg = config(seeds="[0,1,2]")
    plan = study_cmd.arms(cfg)
    assert len(plan) == 3 * 2 * 3
    adaptive = [a for a in plan if a["budget"]]
    assert len(adaptive) == 3 and all(a["regime"] == "budget" for a in adaptive)
    # the adaptive arm spends what the uniform one does: budget_n paths per group on average
    assert adaptive[0]["budget"]["total"] == cfg.budget_n * cfg.run["train"]["groups_per_step"]
    only = study_cmd.arms(config(seeds="[4]", regimes="[equal_samples]"))
    assert [(a["label"], a["seed"]) for a in only] == [("N=16", 4), ("N=512", 4)]


def test_eval_points_are_evenly_spaced_and_end_at_the_last_step():
    assert study_cmd.eval_points(12, 4) == [3, 6, 9, 12]
    assert study_cmd.eval_points(10, 3) == [3, 7, 10]
    assert study_cmd.eval_points(1, 4) == [1]


def fake_report(labels):
    ks = {"1": 0.2, "2": 0.3, "4": 0.4}
    runs = []
    for i, (regime, label) in enumerate(labels):
        for seed in (0, 1):
            runs.append(
                {
                    "regime": regime,
                    "label": label,
                    "seed": seed,
                    "n": 16,
                    "steps": 4,
                    "generated": 512.0,
                    "wall_s": 30.0 + seed,
                    "curve": [
                        {"step": s, "samples": 128 * s, "wall_s": 7.0 * s, "accuracy": 0.1 * s}
                        for s in (2, 4)
                    ],
                    "accuracy_final": 0.4 + 0.01 * i,
                    "pass_at_k": ks,
                    "eur_mean": 0.5,
                    "reward_entropy_mean": 0.3,
                    "mixed_groups_mean": 0.6,
                    "probe_fell_fraction_mean": 0.25,
                    "probe_mean_change_mean": 0.01,
                    "probe_updates_lowering": 0.5,
                }
            )
    return {
        "config": {"seeds": [0, 1], "small_n": 16, "passk_samples": 4},
        "warmstart_accuracy": 0.1,
        "saturation": {
            "curve": [{"step": 5, "accuracy": 0.3}, {"step": 10, "accuracy": 0.31}],
            "plateau_reached": True,
            "plateau_start_step": 5,
            "step": 10,
            "accuracy": 0.31,
            "pass_at_k": ks,
        },
        "runs": runs,
    }


def test_tables_and_plots_from_a_report(tmp_path):
    labels = [("equal_samples", "N=16"), ("equal_samples", "N=512"), ("budget", "uniform N=64")]
    report = fake_report(labels)
    study_report.write_tables(report, tmp_path / "tables.md")
    text = (tmp_path / "tables.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| equal_samples |")]
    assert len(rows) == 2
    # mean ± std over the two seeds; gain = final accuracy − the plateau's 0.31
    assert "| 0.400 ± 0.000 | 0.090 ± 0.000 |" in rows[0] and "| 30.500 ± 0.500 |" in rows[0]
    assert "| plateau | 0.200 | 0.300 | 0.400 |" in text
    assert "| budget: uniform N=64 | 0.200 ± 0.000 | 0.300 ± 0.000 | 0.400 ± 0.000 |" in text
    study_report.write_plots(report, tmp_path)
    for name in ("saturation", "accuracy_equal_samples", "accuracy_equal_wall", "pass_at_k"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert (tmp_path / "probe_mass.png").stat().st_size > 1000
