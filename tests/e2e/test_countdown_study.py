"""A shortened `brorl study countdown`: one seed, tiny budgets, through the real services. The
saturation run must reach its (forced) plateau and go on as the narrow arm; the wide arm must
be a fork that resumed from the plateau checkpoint (its steps continue from there, its counters
too); the warm-start arms and the adaptive one run; results, tables and plots are written."""

import json
import shutil
import subprocess
import sys

import pytest

from brorl.apps.cluster.launcher import REPO_ROOT
from tests.ports import free_port_block

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]

# A Countdown warm-start of 80 steps, which solves almost nothing: the reward is `countdown`
# with a format component (0.1 for a well-formed wrong expression, recipe.reward), so that groups
# are mixed (this test is about the command, not the claim).
WARMSTART = "[--steps,80,--eval-problems,50,--passk-problems,2,--passk-samples,8]"
REWARD = [
    "reward.functions.countdown_fmt.type=countdown",
    "reward.functions.countdown_fmt.format_weight=0.1",
    "run.reward_fn=countdown_fmt",
]


def test_short_countdown_study_forks_the_plateau_and_writes_its_report(tmp_path):
    out = tmp_path / "docs"
    cmd = [
        sys.executable, "-m", "brorl.apps.cli", "study", "countdown", "--workdir",
        str(tmp_path / "work"), "--base-port", str(free_port_block()),
        "seeds=[0]", "small_n=8", "wide_n=32", "warm_ns=[8]", "adaptive_n=8",
        "adaptive_n_min=2", "adaptive_n_max=24", "train_problems=300", f"warmstart={WARMSTART}",
        "eval_problems=50", "eval_every=1", "plateau_window=1", "plateau_min_gain=1.0",
        "saturate_max_steps=3", "sample_budget=200", "eval_points=2", "probe_problems=4",
        "passk_problems=3", "passk_samples=8", "run.train.groups_per_step=2",
        "run.async.max_inflight_groups=8", *REWARD, f"out={out}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    (tmp_path / "stdout.txt").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    sat = report["saturation"]
    assert sat["plateau_reached"] and sat["step"] == 1 and len(sat["curve"]) == 1
    arms = [(r["phase"], r["label"]) for r in report["runs"]]
    assert arms == [("plateau", "N=8"), ("plateau", "N=32"), ("warmstart", "N=8"),
                    ("warmstart", "adaptive 2..24 (mean 8)")]  # fmt: skip
    narrow, wide = report["runs"][:2]
    assert narrow["continued"] and narrow["run_id"] == sat["run_id"]
    assert not wide.get("continued") and wide["run_id"] != sat["run_id"]
    # the fork resumed at the plateau: its first step is P + 1, and it generated no more than
    # the budget since P (the counters it restored are the saturation run's at P)
    assert wide["curve"][0]["step"] > sat["step"]
    assert 2 * 32 <= wide["generated"] <= 200
    for r in report["runs"]:
        assert [p["step"] for p in r["curve"]][-1] == r["steps"]
        assert all(0.0 <= p["accuracy"] <= 1.0 for p in r["curve"])
        assert set(r["curve"][-1]["by_label"]) == {"easy", "medium", "hard"}
        assert list(r["pass_at_k"]) == ["1", "2", "4", "8"]
        assert sum(r["groups"].values()) > 0 and r["wall_s"] > 0
        assert r["equal_wall"]["wall_s"] <= r["wall_s"]
        assert r["probe_mean_change"] is not None
    tables = (out / "tables.md").read_text()
    assert "### Saturation (N = 8)" in tables and "| adaptive 2..24 (mean 8) |" in tables
    for name in ("study_saturation.png", "study_accuracy_plateau.png",
                 "study_accuracy_warmstart.png", "study_pass_at_k.png"):  # fmt: skip
        assert (out / name).stat().st_size > 1000, name
    shutil.rmtree(tmp_path / "work", ignore_errors=True)  # the runs' weight versions
