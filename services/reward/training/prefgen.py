"""Generate a pairwise preference set of worked arithmetic: "12+35=" → chosen "47", rejected a
wrong sum.

    python -m services.reward.training.prefgen --out prefs.jsonl --n 20000 [--seed 0] [--digits 2]

Each line is ``{"prompt", "chosen", "rejected", "kind"}``. Most wrong sums are near misses, so a
reward model has to check the arithmetic rather than the size of the number: ``units`` (last digit
wrong, 25%), ``carry`` (a forgotten or invented carry: ±10 or -100, 25%), ``swap`` (two digits
swapped, 10%), ``near`` (within ±20, 10%); ``far`` (30%) is any number up to twice the largest
operand. ``kind`` is not used for training; rm_train reports validation accuracy per kind when it is
present.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


KINDS = {"far": 0.3, "units": 0.25, "carry": 0.25, "swap": 0.1, "near": 0.1}


def wrong_sum(correct: int, rng: random.Random, kind: str, hi: int) -> int:
    """A wrong answer of the given kind (falls back to "far" when the kind cannot apply)."""
    for _ in range(100):
        if kind == "units":  # last digit wrong
            wrong = correct - correct % 10 + rng.choice([d for d in range(10) if d != correct % 10])
        elif kind == "carry":  # a forgotten or invented carry
            wrong = correct + rng.choice([-10, 10, -100] if correct >= 100 else [-10, 10])
        elif kind == "swap" and correct >= 10:
            digits = list(str(correct))
            i = rng.randrange(len(digits) - 1)
            digits[i], digits[i + 1] = digits[i + 1], digits[i]
            wrong = int("".join(digits))
        elif kind == "near":
            wrong = correct + rng.choice([d for d in range(-20, 21) if d])
        else:
            wrong = rng.randint(0, 2 * hi)
        if wrong != correct and wrong >= 0:
            return wrong
        kind = "far"
    return correct + 1


def generate(n: int, seed: int = 0, digits: int = 2) -> list[dict]:
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    kinds, weights = list(KINDS), list(KINDS.values())
    pairs = []
    for _ in range(n):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        correct = a + b
        kind = rng.choices(kinds, weights)[0]
        pairs.append(
            {
                "prompt": f"{a}+{b}=",
                "chosen": str(correct),
                "rejected": str(wrong_sum(correct, rng, kind, hi)),
                "kind": kind,
            }
        )
    return pairs


def write_jsonl(pairs: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.reward.training.prefgen", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="JSONL file to write")
    parser.add_argument("--n", type=int, default=20000, help="number of pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--digits", type=int, default=2, choices=[1, 2, 3], help="digits per operand"
    )
    args = parser.parse_args(argv)
    path = write_jsonl(generate(args.n, args.seed, args.digits), args.out)
    print(json.dumps({"out": str(path), "pairs": args.n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
