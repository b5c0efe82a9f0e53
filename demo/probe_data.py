"""Write a probe set (JSONL of {"prompt", "reference"}) for the probe-mass metric: held-out
problems of the warm-start's task that neither the warm-start nor the greedy evaluations use —
``--skip`` past the evaluated prefix, and inside the prefix the warm-start excluded:

    python -m demo.probe_data --model WARMSTART_DIR --out probes.jsonl --n 32 --skip 500
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
    ap.add_argument("--model", required=True, help="warm-start model directory")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=32, help="probe prompts")
    ap.add_argument("--skip", type=int, default=500, help="held-out problems evaluated (skipped)")
    args = ap.parse_args(argv)
    from demo.task import heldout_problems
    from demo.warmstart import WarmstartConfig, read_marker, task_kwargs

    meta = read_marker(args.model)
    base = WarmstartConfig.from_dict(meta["config"]) if meta else WarmstartConfig()
    if args.skip + args.n > base.exclude_heldout:
        ap.error(
            f"--skip + --n = {args.skip + args.n} exceeds the {base.exclude_heldout} held-out "
            "problems the warm-start never trained on"
        )
    rows = heldout_problems(args.skip + args.n, **task_kwargs(base))[args.skip :]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "".join(json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n" for p in rows)
    )
    print(f"wrote {len(rows)} probes to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
