"""``python -m demo``: warm-start and evaluate the CPU demo's tiny model.

    python -m demo warmstart --out runs/demo/warmstart [--steps 1500 --lr 3e-3 ...] [--json]
    python -m demo eval --model runs/demo/warmstart --n 200 [--json]

``warmstart`` trains once per configuration and afterwards returns the cached model at
once. ``eval`` reads the task distribution from the model's ``warmstart.json`` unless it
is given on the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import MISSING, asdict, fields


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    from demo.warmstart import WarmstartConfig

    group = parser.add_argument_group("warm-start settings (defaults: the demo recipe)")
    for f in fields(WarmstartConfig):
        default = f.default if f.default is not MISSING else None
        kind = type(default) if default is not None else str
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            default=None,
            help=f"default {default!r}",
        )


def _cmd_warmstart(args) -> int:
    from demo.warmstart import WarmstartConfig, is_cached, read_marker, warmstart

    overrides = {
        f.name: getattr(args, f.name)
        for f in fields(WarmstartConfig)
        if getattr(args, f.name) is not None
    }
    cfg = WarmstartConfig.from_dict({**asdict(WarmstartConfig()), **overrides})
    cached = not args.force and is_cached(args.out, cfg)
    t0 = time.perf_counter()
    path = warmstart(args.out, cfg, force=args.force, progress=not args.json)
    meta = read_marker(path) or {}
    result = {
        "model": str(path),
        "cached": cached,
        "config_hash": cfg.hash(),
        "heldout_accuracy": meta.get("heldout_accuracy"),
        "heldout_n": meta.get("heldout_n"),
        "train_seconds": meta.get("train_seconds"),
        "seconds": round(time.perf_counter() - t0, 2),
        "params": meta.get("params"),
    }
    if args.json:
        print(json.dumps(result))
    else:
        how = "cached" if cached else f"trained in {meta.get('train_seconds')} s"
        print(f"warm-start model: {path} ({how}, {result['params']:,} parameters)")
        print(
            f"held-out greedy exact-match accuracy: {result['heldout_accuracy']:.3f} "
            f"(n={result['heldout_n']}; right number in any spelling: "
            f"{meta.get('heldout_numeric_accuracy', float('nan')):.3f})"
        )
    return 0


def _cmd_eval(args) -> int:
    from demo.evaluate import evaluate
    from demo.task import heldout_problems
    from demo.warmstart import WarmstartConfig, read_marker, task_kwargs

    meta = read_marker(args.model)
    base = WarmstartConfig.from_dict(meta["config"]) if meta else WarmstartConfig()
    task = task_kwargs(base)
    for key in ("max_digits", "min_digits", "ops"):
        if getattr(args, key) is not None:
            task[key] = getattr(args, key)
    if args.n > base.exclude_heldout:
        print(
            f"warning: only the first {base.exclude_heldout} held-out problems are "
            "guaranteed absent from the warm-start's training data",
            file=sys.stderr,
        )
    problems = heldout_problems(args.n, **task)
    result = evaluate(args.model, problems, batch_size=args.batch_size)
    if args.json:
        print(json.dumps({"model": str(args.model), **task, **result.to_dict()}))
    else:
        print(
            f"{args.model}: held-out greedy exact-match accuracy {result.accuracy:.3f} "
            f"({result.correct}/{result.n}) in {result.seconds:.2f} s; right number in "
            f"any spelling: {result.numeric_accuracy:.3f}"
        )
        for ex in result.examples:
            mark = "ok " if ex["correct"] else "bad"
            print(f"  {mark} {ex['prompt']}{ex['completion']!r:8} (answer {ex['answer']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    ws = sub.add_parser("warmstart", help="SFT warm-start of the tiny model (cached)")
    ws.add_argument("--out", required=True, help="model directory to write or reuse")
    ws.add_argument("--force", action="store_true", help="retrain even if cached")
    ws.add_argument("--json", action="store_true", help="print one JSON object")
    _add_config_flags(ws)
    ws.set_defaults(func=_cmd_warmstart)

    ev = sub.add_parser("eval", help="greedy exact-match accuracy on held-out problems")
    ev.add_argument("--model", required=True, help="model directory")
    ev.add_argument("--n", type=int, default=200, help="held-out problems (default 200)")
    ev.add_argument("--batch-size", type=int, default=256)
    ev.add_argument("--max-digits", dest="max_digits", type=int, default=None)
    ev.add_argument("--min-digits", dest="min_digits", type=int, default=None)
    ev.add_argument("--ops", default=None)
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=_cmd_eval)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.json else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
