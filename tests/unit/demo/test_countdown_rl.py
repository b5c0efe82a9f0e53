"""The Countdown RL run's inputs (demo/countdown/rl.py) and its recipe (configs/countdown.yaml):
the prompt sets carry the difficulty label the run's eval rounds split by, never share a set of
numbers between train and held-out, and the recipe builds a run config that judges with the
``countdown`` reward and reports per label."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from brorl.apps.cluster.launcher import REPO_ROOT
from demo.countdown import rl
from demo.countdown.task import LABELS, heldout, split_of
from services.reward.functions.countdown import Verdict, check


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_data_writes_labelled_prompt_sets_of_their_own_splits(tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    rl.main(["data", "--out", str(train), "--n", "300", "--heldout-out", str(held),
             "--heldout-n", "57"])  # fmt: skip
    train_rows, held_rows = read(train), read(held)
    assert (len(train_rows), len(held_rows)) == (300, 57)
    for row in train_rows + held_rows:
        assert set(row) == {"prompt", "reference", "label"} and row["label"] in LABELS
        assert row["prompt"] == row["reference"] + "="
    numbers = [tuple(map(int, r["reference"].split(":")[0].split(","))) for r in train_rows]
    assert {split_of(n) for n in numbers} == {"train"}
    # the held-out rows are the first held-out problems: the before/after evaluation's too
    assert [r["reference"] for r in held_rows] == [p.reference for p in heldout(57)]
    assert {r["label"] for r in train_rows} == set(LABELS)  # every stratum is trained on


def test_data_of_chosen_labels_is_the_split_filtered_in_its_own_order(tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    rl.main(["data", "--out", str(train), "--n", "150", "--heldout-out", str(held),
             "--heldout-n", "40", "--labels", "easy", "medium"])  # fmt: skip
    rows = read(train)
    assert len(rows) == 150 and {r["label"] for r in rows} == {"easy", "medium"}
    every = rl.train_set(400)  # the unfiltered split: the labelled set is its filtered prefix
    assert [r["reference"] for r in rows] == [
        p.reference for p in every if p.label in ("easy", "medium")
    ][:150]
    assert {r["label"] for r in read(held)} == set(LABELS)  # the evaluation keeps every label
    hard = rl.train_set(30, ["hard"])
    assert [p.label for p in hard] == ["hard"] * 30 and rl.train_set(10, ["hard"]) == hard[:10]


def test_train_labels_reach_the_data_command_and_only_countdown_takes_them(tmp_path):
    from brorl.apps import tasks
    from brorl.apps.demo_cmd import DemoConfig
    from brorl.apps.recipe import CONFIGS, load_recipe

    cfg = load_recipe(DemoConfig, CONFIGS / "countdown.yaml", ["train_labels=[easy]"])
    calls = []

    def python_module(*args, capture=False):  # records the commands; eval answers as rl.py does
        calls.append(args)
        return json.dumps({"accuracy": 0.0, "by_label": {}, "verdicts": {}}) if capture else ""

    tasks.prepare(cfg, tmp_path, python_module)
    [data] = [c for c in calls if c[:2] == ("demo.countdown.rl", "data")]
    assert data[-2:] == ("--labels", "easy")
    with pytest.raises(Exception, match="train_labels"):
        load_recipe(DemoConfig, CONFIGS / "demo.yaml", ["train_labels=[easy]"])
    with pytest.raises(Exception, match="train_labels"):
        load_recipe(DemoConfig, CONFIGS / "countdown.yaml", ["train_labels=[tricky]"])
    # the recipe (brorl/apps may not import demo) spells the task's labels out: they must agree
    [label_type] = typing.get_args(DemoConfig.model_fields["train_labels"].annotation)
    assert typing.get_args(label_type) == LABELS


def test_the_references_are_what_the_reward_reads(tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    rl.main(["data", "--out", str(train), "--n", "20", "--heldout-out", str(held),
             "--heldout-n", "5"])  # fmt: skip
    for row in read(train):
        numbers, target = row["reference"].split(":")
        first = numbers.split(",")[0]
        verdict = check(first, tuple(map(int, numbers.split(","))), int(target))[0]
        assert verdict in (Verdict.UNUSED_NUMBER, Verdict.CORRECT)  # read, not refused


def test_eval_refuses_a_directory_without_a_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "demo.countdown.rl", "eval", "--model", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "no model directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_eval_reports_the_accuracy_per_label(tmp_path):
    from demo.countdown.warmstart import CountdownWarmstartConfig, warmstart

    tiny = CountdownWarmstartConfig(
        train_problems=100, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64,
        steps=2, batch_size=8, warmup_steps=1, eval_problems=30, passk_problems=0,
    )  # fmt: skip
    meta = warmstart(tmp_path / "m", tiny)
    got = rl.greedy_eval(tmp_path / "m", 30)
    assert got["accuracy"] == meta["greedy_pass_at_1"]["overall"]
    assert got["by_label"] == meta["greedy_pass_at_1"]["by_label"]
    assert got["verdicts"] == meta["greedy_pass_at_1"]["verdicts"]
    assert sum(got["n_by_label"].values()) == got["n"] == 30


def test_the_countdown_recipe_judges_with_its_reward_and_reports_per_label():
    from brorl.apps.demo_cmd import DemoConfig
    from brorl.apps.recipe import CONFIGS, DemoInputs, build_run_config, load_recipe

    cfg = load_recipe(DemoConfig, CONFIGS / "countdown.yaml")
    assert cfg.task == "countdown"
    inputs = DemoInputs(Path("/m"), Path("/d.jsonl"), 0.1, heldout=Path("/h.jsonl"))
    run = build_run_config(cfg, inputs)
    assert run.reward_fn == "countdown" and run.data.fields.stratum == "label"
    assert run.data.eval_path == "/h.jsonl" and run.eval_every > 0
    assert run.data.eval_max_prompts <= cfg.eval_problems
    with pytest.raises(Exception, match="task"):
        load_recipe(DemoConfig, CONFIGS / "countdown.yaml", ["task=subtraction"])


@pytest.mark.parametrize("label", ["hard", "easy", ""])
def test_probes_are_probe_split_problems_each_with_a_solution_the_reward_accepts(tmp_path, label):
    out = tmp_path / "probes.jsonl"
    assert rl.main(["probes", "--out", str(out), "--n", "7", "--label", label]) == 0
    rows = read(out)
    assert len(rows) == 7 and len({r["prompt"] for r in rows}) == 7
    for r in rows:
        numbers = tuple(int(x) for x in r["prompt"].split(":")[0].split(","))
        target = int(r["prompt"].split(":")[1].rstrip("="))
        assert split_of(numbers) == "probe"
        assert check(r["reference"], numbers, target)[0] == Verdict.CORRECT, r
        assert r["label"] == label or (not label and r["label"] in LABELS)
    rl.main(["probes", "--out", str(tmp_path / "again.jsonl"), "--n", "7", "--label", label])
    assert read(tmp_path / "again.jsonl") == rows  # deterministic


def test_the_demo_prints_the_commonest_verdicts_before_and_after():
    from brorl.apps.demo_cmd import verdict_lines

    before = {"easy": {"wrong_value": 0.7, "correct": 0.2, "reused_number": 0.1}}
    after = {
        "easy": {"wrong_value": 0.5, "correct": 0.3, "reused_number": 0.15, "syntax": 0.05},
        "hard": {"wrong_value": 1.0},
    }
    assert verdict_lines(before, after, top=3) == [
        "easy: wrong_value 70.0% → 50.0%, correct 20.0% → 30.0%, reused_number 10.0% → 15.0%",
        "hard: wrong_value 0.0% → 100.0%",
    ]
