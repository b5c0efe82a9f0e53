"""The tasks a recipe trains on (``task:`` of configs/demo.yaml and the files over it): how its
inputs are prepared (warm-start, RL prompt set), how a model's held-out accuracy is measured, and
which environment service the cluster starts for it. The demo package does the work (torch), as
subprocesses.

* ``addition``: the demo's arithmetic (demo/task.py, demo/warmstart.py), single-turn paths;
* ``tooluse``: multiplication with a calculator tool (demo/tooluse.py): every path is an episode
  against the calculator environment (envs/calculator.py), started with the cluster;
* ``countdown``: reach a target from 3-4 numbers (demo/countdown/, docs/countdown.md), judged by
  the ``countdown`` reward; held-out accuracy also per difficulty label (easy, medium, hard).
"""

from __future__ import annotations

import json
from pathlib import Path

TASKS = ("addition", "tooluse", "countdown")


def prepare(cfg, work: Path, python_module):
    """(model, RL prompt set, held-out prompt set or None, the warm-start's ``evaluate``) of
    ``cfg.task``;
    ``python_module`` runs ``python -m ...`` in the repository (recipe.python_module)."""
    if cfg.task == "tooluse":
        model, data, held = work / "tooluse_warmstart", work / "tooluse_train.jsonl", None
        python_module("demo.tooluse_warmstart", "warmstart", "--out", str(model), *cfg.warmstart)
        held = work / "tooluse_heldout.jsonl"
        python_module(
            "demo.tooluse_warmstart", "data", "--out", str(data), "--n", str(cfg.train_problems),
            "--heldout-out", str(held), "--heldout-n", str(cfg.eval_problems),
        )  # fmt: skip
        return model, data, held, evaluate(cfg, model, cfg.eval_problems, python_module)
    if cfg.task == "countdown":
        model, data = work / "countdown_warmstart", work / "countdown_train.jsonl"
        held = work / "countdown_heldout.jsonl"
        # two torch threads: the warm-start trains before the cluster starts (speed only, not
        # in its config hash)
        python_module(
            "demo.countdown.warmstart", "--out", str(model), "--threads", "2", *cfg.warmstart
        )
        python_module(
            "demo.countdown.rl", "data", "--out", str(data), "--n", str(cfg.train_problems),
            "--heldout-out", str(held), "--heldout-n", str(cfg.eval_problems),
            *(["--labels", *cfg.train_labels] if cfg.train_labels else []),
        )  # fmt: skip
        return model, data, held, evaluate(cfg, model, cfg.eval_problems, python_module)
    model, data = work / "warmstart", work / "train.jsonl"
    python_module("demo", "warmstart", "--out", str(model), *cfg.warmstart)
    python_module(
        "demo.rl_data", "--model", str(model), "--out", str(data), "--n", str(cfg.train_problems)
    )
    return model, data, None, evaluate(cfg, model, cfg.eval_problems, python_module)


def accuracy(cfg, model: Path, n: int, python_module) -> float:
    """Held-out greedy accuracy of a model directory on ``n`` problems of ``cfg.task``."""
    return evaluate(cfg, model, n, python_module)["accuracy"]


def evaluate(cfg, model: Path, n: int, python_module) -> dict:
    """{"accuracy": held-out greedy accuracy on ``n`` problems of ``cfg.task``, "by_stratum":
    {label: accuracy} for a task with difficulty labels, else {}, "verdicts": {label: {verdict:
    share of the greedy answers}} for a task whose checker names its verdicts, else {}}."""
    if cfg.task == "countdown":
        out = python_module(
            "demo.countdown.rl", "eval", "--model", str(model), "--n", str(n), "--threads", "2",
            capture=True,
        )  # fmt: skip
        got = json.loads(out.strip().splitlines()[-1])
        return {"accuracy": got["accuracy"], "by_stratum": got["by_label"],
                "verdicts": got["verdicts"]}  # fmt: skip
    return {"accuracy": _accuracy(cfg, model, n, python_module), "by_stratum": {}, "verdicts": {}}


def _accuracy(cfg, model: Path, n: int, python_module) -> float:
    if cfg.task == "tooluse":
        # the task as the run's environment poses it: without the tool, every call is unknown
        tool = environment(cfg).get("calculator", {}).get("tool", True)
        flags = [] if tool else ["--no-tool"]
        out = python_module(
            "demo.tooluse_warmstart", "eval", "--model", str(model), "--n", str(n), *flags,
            capture=True,
        )  # fmt: skip
        return json.loads(out.strip().splitlines()[-1])["success"]
    out = python_module(
        "demo", "eval", "--model", str(model), "--n", str(n), "--json", capture=True
    )
    return json.loads(out.strip().splitlines()[-1])["accuracy"]


def environment(cfg) -> dict:
    """The environment service the cluster starts for ``cfg.task`` (its `python -m envs`
    overrides; {}: none) — ``cfg.environment`` on top of the task's own."""
    base = {"env": "calculator"} if cfg.task == "tooluse" else {}
    return {**base, **cfg.environment} if base or cfg.environment else {}
