"""The Countdown RL run's inputs and its held-out measurement (brorl/apps/tasks.py ``countdown``):

    python -m demo.countdown.rl data --out train.jsonl --n 20000 --heldout-out held.jsonl
    python -m demo.countdown.rl eval --model DIR --n 1000      (one JSON line)

``data`` writes the RL prompt set (train split, drawn with its own seed: problems the warm-start
may also have seen, never a held-out one) and the held-out prompts the run evaluates every
``eval_every`` steps, as ``{"prompt", "reference", "label"}`` rows; ``label`` (easy / medium /
hard, docs/countdown.md) is the column the run's ``data.fields.stratum`` names. ``eval`` is the
greedy pass@1 of a model directory on the first ``n`` held-out problems, overall and per label,
judged by the ``countdown`` reward's checker.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from demo.countdown.task import heldout, problems, rows

RL_DATA_SEED = 2  # the warm-start draws its examples with seed 1 (CountdownWarmstartConfig)


def write_rows(path: str | Path, items) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows(items))


def greedy_eval(model_dir: str | Path, n: int, threads: int = 1) -> dict:
    """Greedy pass@1 of ``model_dir`` on the first ``n`` held-out problems: {"accuracy",
    "by_label", "n_by_label", "n"}."""
    import torch

    from demo.countdown.warmstart import greedy_pass
    from demo.evaluate import load_model

    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir)
    got = greedy_pass(model, tokenizer, heldout(n))
    return {"accuracy": got["overall"], **{k: got[k] for k in ("n", "by_label", "n_by_label")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Countdown RL prompts and held-out evaluation.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write the RL prompt set and the run's held-out prompts")
    d.add_argument("--out", required=True, help="RL prompt set (JSONL)")
    d.add_argument("--n", type=int, default=20_000, help="RL prompts (train split)")
    d.add_argument("--heldout-out", required=True, help="held-out prompts (JSONL)")
    d.add_argument("--heldout-n", type=int, default=300, help="held-out prompts")
    e = sub.add_parser("eval", help="greedy pass@1 on held-out problems (one JSON line)")
    e.add_argument("--model", required=True, help="a model directory")
    e.add_argument("--n", type=int, default=1000, help="held-out problems")
    e.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    if args.cmd == "data":
        if args.n < 1 or args.heldout_n < 1:
            ap.error("--n and --heldout-n must be at least 1")
        write_rows(args.out, problems(args.n, "train", RL_DATA_SEED))
        write_rows(args.heldout_out, heldout(args.heldout_n))
        return 0
    if args.n < 1:
        ap.error("--n must be at least 1")
    if not (Path(args.model) / "config.json").is_file():
        ap.error(f"--model {args.model}: no model directory (config.json) there")
    print(json.dumps(greedy_eval(args.model, args.n, args.threads)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
