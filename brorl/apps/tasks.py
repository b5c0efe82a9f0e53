"""The tasks a recipe trains on (``task:`` of configs/demo.yaml and the files over it): how its
inputs are prepared (warm-start, RL prompt set), how a model's held-out accuracy is measured, and
which environment service the cluster starts for it. The demo package does the work (torch), as
subprocesses.

* ``addition``: the demo's arithmetic (demo/task.py, demo/warmstart.py), single-turn paths;
* ``tooluse``: multiplication with a calculator tool (demo/tooluse.py): every path is an episode
  against the calculator environment (envs/calculator.py), started with the cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

TASKS = ("addition", "tooluse")


def prepare(cfg, work: Path, python_module):
    """(model, RL prompt set, held-out prompt set or None, warm-start accuracy) of ``cfg.task``;
    ``python_module`` runs ``python -m ...`` in the repository (recipe.python_module)."""
    if cfg.task == "tooluse":
        model, data, held = work / "tooluse_warmstart", work / "tooluse_train.jsonl", None
        python_module("demo.tooluse_warmstart", "warmstart", "--out", str(model), *cfg.warmstart)
        held = work / "tooluse_heldout.jsonl"
        python_module(
            "demo.tooluse_warmstart", "data", "--out", str(data), "--n", str(cfg.train_problems),
            "--heldout-out", str(held), "--heldout-n", str(cfg.eval_problems),
        )  # fmt: skip
        return model, data, held, accuracy(cfg, model, cfg.eval_problems, python_module)
    model, data = work / "warmstart", work / "train.jsonl"
    python_module("demo", "warmstart", "--out", str(model), *cfg.warmstart)
    python_module(
        "demo.rl_data", "--model", str(model), "--out", str(data), "--n", str(cfg.train_problems)
    )
    return model, data, None, accuracy(cfg, model, cfg.eval_problems, python_module)


def accuracy(cfg, model: Path, n: int, python_module) -> float:
    """Held-out greedy accuracy of a model directory on ``n`` problems of ``cfg.task``."""
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
