"""Evaluate several model directories (e.g. published weight versions) in one process:

    python -m demo.eval_many --tokenizer WARMSTART_DIR --n 200 DIR [DIR ...]

prints one JSON object per directory: {"model": DIR, "accuracy": ...}. Weight-store versions
hold weights and config but no tokenizer, hence --tokenizer.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--tokenizer", required=True, help="directory with the tokenizer (the warm-start model)"
    )
    ap.add_argument("--n", type=int, default=200, help="held-out problems")
    ap.add_argument("models", nargs="+")
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from demo.evaluate import evaluate, load_tokenizer
    from demo.task import heldout_problems
    from demo.warmstart import WarmstartConfig, read_marker, task_kwargs

    meta = read_marker(args.tokenizer)
    base = WarmstartConfig.from_dict(meta["config"]) if meta else WarmstartConfig()
    problems = heldout_problems(args.n, **task_kwargs(base))
    tok = load_tokenizer(args.tokenizer)
    for path in args.models:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        result = evaluate(model, problems, tokenizer=tok)
        print(json.dumps({"model": path, "accuracy": result.accuracy, "n": result.n}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
