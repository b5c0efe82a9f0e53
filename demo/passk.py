"""pass@k of a demo model on held-out problems: sample ``--samples`` completions per problem
(temperature 1, no top-k/top-p, up to the first <eos>) and estimate pass@k for each k with the
unbiased estimator of Chen et al. (2021):

    pass@k = 1 - C(n - c, k) / C(n, k)      (n samples of a problem, c of them correct)

averaged over problems. ``python -m demo.passk --tokenizer WARMSTART_DIR --n 100 --samples 64
--ks 1,2,4,8,16,32,64 DIR [DIR ...]`` prints one JSON object per model directory (weight-store
versions hold no tokenizer, hence --tokenizer; it also names the task).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from fractions import Fraction


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c correct of n samples, as the stable product
    1 - prod_{i = n-c+1}^{n} (1 - k / i); 1 when fewer than k samples are wrong."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_reference(n: int, c: int, k: int) -> float:
    """Exact twin of ``pass_at_k``: the binomial ratio in rational arithmetic."""
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def sample_correct(model, tokenizer, problems, samples: int, seed: int, batch: int = 16):
    """How many of ``samples`` sampled completions of each problem equal its answer exactly."""
    import torch

    from demo.evaluate import left_padded

    torch.manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    width_new = max(len(p.answer) for p in problems) + 2
    counts = []
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        input_ids, attention, width = left_padded(tokenizer, [p.prompt for p in chunk])
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                num_return_sequences=samples,
                max_new_tokens=width_new,
                eos_token_id=eos,
                pad_token_id=pad,
            )[:, width:]  # (B * samples, new)
        rows = out.tolist()
        for b, p in enumerate(chunk):
            hits = 0
            for row in rows[b * samples : (b + 1) * samples]:
                if eos in row and tokenizer.decode(row[: row.index(eos)]) == p.answer:
                    hits += 1
            counts.append(hits)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokenizer", required=True, help="directory with the tokenizer and task")
    ap.add_argument("--n", type=int, default=100, help="held-out problems")
    ap.add_argument("--samples", type=int, default=64, help="completions per problem")
    ap.add_argument("--ks", default="1,2,4,8,16,32,64", help="comma-separated k values")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("models", nargs="+", help="model directories (or weight versions)")
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    if not all(1 <= k <= args.samples for k in ks):
        ap.error(f"every k must lie in [1, --samples={args.samples}]")

    from demo.eval_many import load_model
    from demo.evaluate import load_tokenizer
    from demo.task import heldout_problems
    from demo.warmstart import WarmstartConfig, read_marker, task_kwargs

    meta = read_marker(args.tokenizer)
    base = WarmstartConfig.from_dict(meta["config"]) if meta else WarmstartConfig()
    problems = heldout_problems(args.n, **task_kwargs(base))
    tok = load_tokenizer(args.tokenizer)
    for path in args.models:
        model = load_model(path, args.tokenizer)  # a HF directory or a published weight version
        correct = sample_correct(model, tok, problems, args.samples, args.seed)
        result = {
            "model": path,
            "n": len(problems),
            "samples": args.samples,
            "pass_at_k": {
                str(k): sum(pass_at_k(args.samples, c, k) for c in correct) / len(correct)
                for k in ks
            },
        }
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
