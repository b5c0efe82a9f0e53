"""Write the RL prompt set of the demo task as JSONL ({"prompt", "reference"} rows), drawn from
the same task distribution as the warm-start model and disjoint from the held-out problems:

    python -m demo.rl_data --model WARMSTART_DIR --out train.jsonl [--n 20000] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model",
        required=True,
        help="warm-start model directory (its warmstart.json names the task)",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    from demo.task import count_distinct, heldout_problems, problems
    from demo.warmstart import WarmstartConfig, read_marker, task_kwargs

    meta = read_marker(args.model)
    base = WarmstartConfig.from_dict(meta["config"]) if meta else WarmstartConfig()
    task = task_kwargs(base)
    held = {p.prompt for p in heldout_problems(base.exclude_heldout, **task)}
    n = min(
        args.n,
        count_distinct(task["max_digits"], task["ops"], task.get("min_digits", 1)) - len(held),
    )
    rows = problems(n, seed=args.seed, exclude=held, **task)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(
        "".join(json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n" for p in rows)
    )
    tmp.replace(out)
    print(f"wrote {len(rows)} prompts to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
