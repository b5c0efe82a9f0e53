"""The Countdown RL run's inputs and its held-out measurement (brorl/apps/tasks.py ``countdown``):

    python -m demo.countdown.rl data --out train.jsonl --n 20000 --heldout-out held.jsonl
    python -m demo.countdown.rl eval --model DIR --n 1000      (one JSON line)
    python -m demo.countdown.rl probes --out probes.jsonl --n 32 --label hard
    python -m demo.countdown.rl eval-many --tokenizer WARMSTART --n 300 DIR [DIR ...]

``data`` writes the RL prompt set (train split, drawn with its own seed: problems the warm-start
may also have seen, never a held-out one) and the held-out prompts the run evaluates every
``eval_every`` steps, as ``{"prompt", "reference", "label"}`` rows; ``label`` (easy / medium /
hard, docs/countdown.md) is the column the run's ``data.fields.stratum`` names. ``eval`` is the
greedy pass@1 of a model directory on the first ``n`` held-out problems, overall and per label,
judged by the ``countdown`` reward's checker; ``eval-many`` does the same for several model
directories or weight-store versions in one process (one JSON line each), with the sampled
pass@k of the first ``--passk-problems`` held-out problems of ``--passk-label`` when asked.
``probes`` writes a probe set for the learner's probe-mass metric (``probe.path``): problems of
the probe split (never trained on or evaluated), each with one of its solutions, drawn
uniformly by the exact solver, as the ``reference`` whose log-probability the learner follows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import random

from demo.countdown.solver import sample_solution, to_text
from demo.countdown.task import LABELS, Problem, heldout, probes, problems, rows

RL_DATA_SEED = 2  # the warm-start draws its examples with seed 1 (CountdownWarmstartConfig)


def train_set(n: int, labels: list[str] | None = None) -> list[Problem]:
    """The RL prompt set: the first ``n`` problems of the train split (seed RL_DATA_SEED), or
    with ``labels`` the first ``n`` of those labels in the same order (a prefix of the split
    filtered, so a larger ``n`` extends the set)."""
    if not labels:
        return problems(n, "train", RL_DATA_SEED)
    drawn = 2 * n
    while True:
        picked = [p for p in problems(drawn, "train", RL_DATA_SEED) if p.label in labels]
        if len(picked) >= n:
            return picked[:n]
        drawn *= 2


def write_rows(path: str | Path, items) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows(items))


def probe_rows(n: int, label: str = "", seed: int = 0) -> list[dict]:
    """``n`` probe-split problems (of ``label`` only, when given) with a solution each:
    {"prompt", "reference": the solution's text, "label"}."""
    rng = random.Random(f"countdown-probe-solutions:{seed}")
    out, pool = [], 4 * n
    while len(out) < n:
        if pool > 200 * n + 10_000:
            raise ValueError(f"the probe split holds fewer than {n} {label or 'any'} problems")
        found = [p for p in probes(pool) if not label or p.label == label]
        out = [
            {"prompt": p.prompt, "reference": to_text(sample_solution(p.numbers, p.target, rng)),
             "label": p.label}
            for p in found[:n]
        ]  # fmt: skip
        pool *= 2
    return out


def greedy_eval(model_dir: str | Path, n: int, threads: int = 1) -> dict:
    """Greedy pass@1 of ``model_dir`` on the first ``n`` held-out problems: {"accuracy",
    "by_label", "n_by_label", "n", "verdicts"} (verdicts: {label: {verdict: share}})."""
    import torch

    from demo.countdown.warmstart import greedy_pass
    from demo.evaluate import load_model

    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir)
    got = greedy_pass(model, tokenizer, heldout(n))
    keep = ("n", "by_label", "n_by_label", "verdicts")
    return {"accuracy": got["overall"], **{k: got[k] for k in keep}}


def eval_many(tokenizer: str, dirs: list[str], n: int, passk: dict | None, threads: int = 1):
    """``greedy_eval`` of each directory (a weight-store version is rebuilt on ``tokenizer``'s
    model, demo.eval_many), with ``pass_at_k`` of ``passk`` = {"label", "problems", "samples"}
    (counted on the same problems and sample seed for every directory); yields one dict each."""
    import torch

    from demo.countdown.warmstart import CountdownWarmstartConfig, greedy_pass, hard_passk
    from demo.eval_many import load_model
    from demo.evaluate import load_tokenizer

    torch.set_num_threads(threads)
    tok, held = load_tokenizer(tokenizer), heldout(n)
    for path in dirs:
        model = load_model(path, tokenizer)
        got = greedy_pass(model, tok, held)
        row = {
            "model": path,
            "accuracy": got["overall"],
            "n": got["n"],
            "by_label": got["by_label"],
        }
        if passk:
            cfg = CountdownWarmstartConfig(
                passk_problems=passk["problems"], passk_samples=passk["samples"], threads=threads
            )
            sampled = hard_passk(model, tok, cfg, passk["label"])
            row["pass_at_k"] = {k: sampled[k] for k in ("label", "n", "samples", "pass_at_k")}
        yield row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Countdown RL prompts and held-out evaluation.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write the RL prompt set and the run's held-out prompts")
    d.add_argument("--out", required=True, help="RL prompt set (JSONL)")
    d.add_argument("--n", type=int, default=20_000, help="RL prompts (train split)")
    d.add_argument("--heldout-out", required=True, help="held-out prompts (JSONL)")
    d.add_argument("--heldout-n", type=int, default=300, help="held-out prompts")
    d.add_argument("--labels", nargs="+", choices=LABELS, default=[],
                   help="RL prompts of these labels only (default: every label)")  # fmt: skip
    e = sub.add_parser("eval", help="greedy pass@1 on held-out problems (one JSON line)")
    e.add_argument("--model", required=True, help="a model directory")
    e.add_argument("--n", type=int, default=1000, help="held-out problems")
    e.add_argument("--threads", type=int, default=1, help="torch threads")
    m = sub.add_parser("eval-many", help="eval of several directories (one JSON line each)")
    m.add_argument("--tokenizer", required=True, help="the warm-start model directory")
    m.add_argument("--n", type=int, default=300, help="held-out problems (greedy)")
    m.add_argument("--passk-label", default="", choices=["", "easy", "medium", "hard"],
                   help="also sample pass@k on held-out problems of this label")  # fmt: skip
    m.add_argument("--passk-problems", type=int, default=50)
    m.add_argument("--passk-samples", type=int, default=64)
    m.add_argument("--threads", type=int, default=1, help="torch threads")
    m.add_argument("models", nargs="+")
    r = sub.add_parser("probes", help="write a probe set: probe-split problems with a solution")
    r.add_argument("--out", required=True, help="probe set (JSONL)")
    r.add_argument("--n", type=int, default=32, help="probes")
    r.add_argument("--label", default="", choices=["", "easy", "medium", "hard"],
                   help="only problems of this difficulty label ('': any)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.cmd == "eval-many":
        if args.n < 1 or args.passk_problems < 1 or args.passk_samples < 1:
            ap.error("--n, --passk-problems and --passk-samples must be at least 1")
        label = args.passk_label
        passk = {"label": label, "problems": args.passk_problems, "samples": args.passk_samples}
        for row in eval_many(args.tokenizer, args.models, args.n, passk if label else None,
                             args.threads):  # fmt: skip
            print(json.dumps(row), flush=True)
        return 0
    if args.cmd == "probes":
        if args.n < 1:
            ap.error("--n must be at least 1")
        with open(args.out, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in probe_rows(args.n, args.label))
        return 0
    if args.cmd == "data":
        if args.n < 1 or args.heldout_n < 1:
            ap.error("--n and --heldout-n must be at least 1")
        write_rows(args.out, train_set(args.n, args.labels))
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
