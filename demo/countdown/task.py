"""The Countdown task (pure Python, no torch): given 3 or 4 numbers and a target, write an
expression that uses each number exactly once and equals the target, with + - * /, parentheses
and exact division (the ``countdown`` reward function's grammar, docs/rewards.md).

**Problems** (``TaskSpec``; the defaults in brackets). The count of numbers is drawn from
``counts`` [3 or 4, equally likely], each number uniformly from ``low..high`` [1..50, repeats
allowed], and the target uniformly from the values in ``target_low..target_high`` [1..100] that
the numbers reach (demo/countdown/solver.py, an exact solver); numbers that reach none of them
are drawn again. Every problem is solvable.

**Text.** The prompt is ``3,7,25,50:78=`` (the numbers in the order drawn, ``:``, the target,
``=``); the completion is the expression (``(50-25)*3+3``) and the reference is the prompt
without ``=``, which the reward function reads. ``CHARS`` are the task's characters, for
``demo.model.build_tokenizer``: one token each.

**Difficulty.** ``share`` is the chance that an expression drawn uniformly over the numbers (an
order, a shape, the operators) reaches the target: the problem's solution trees over all its
trees, 192 for 3 numbers and 7680 for 4. It is what a sampler that has not learnt the task
hits: with ``share`` below 1/1024 even 512 such draws find a solution less than 40% of the
time. Labels: ``easy`` (share >= 1/128), ``medium`` (1/1024 <= share < 1/128), ``hard``
(share < 1/1024). With 3 numbers the share is at least 1/192, so the hard stratum is 4-number
problems with few solutions. ``additive`` says whether + and - alone reach the target (kept on
each problem, not part of the label).

**Splits.** A problem's split is fixed by a hash of its sorted numbers (``split_of``): held-out
10%, probe 5%, train 85%. The splits never share a problem, nor even a set of numbers with
another target. Each split is drawn with its own seeded stream, so ``heldout(n)`` and
``probes(n)`` are prefixes of longer draws and train sets of any seed stay out of them.

**Demonstrator** (``Demonstrator``): the supervised warm-start imitates it. It writes a solution
drawn uniformly among the problem's solutions with probability ``correct`` (per label
adjustable), else a wrong expression: with probability ``reuse`` a solution with one number
replaced by another of the given ones (a number used twice, one left out), otherwise a near
miss (of ``near`` random well-formed expressions over the numbers, the one closest to the
target without reaching it).

``python -m demo.countdown.task --stats 2000`` prints the distribution over the labels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass

from demo.countdown.solver import (
    Tree,
    additive,
    leaves,
    random_tree,
    sample_solution,
    to_text,
    trees,
    value,
    value_counts,
)

CHARS = list("0123456789+-*/()=,:")
SPLITS = {"heldout": (0, 100), "probe": (100, 150), "train": (150, 1000)}  # per mille of the hash
HELDOUT_SEED, PROBE_SEED = 3_000_017, 3_000_019
EASY_SHARE, HARD_SHARE = 1 / 128, 1 / 1024
LABELS = ("easy", "medium", "hard")


@dataclass(frozen=True)
class TaskSpec:
    counts: tuple[int, ...] = (3, 4)  # how many numbers a problem has (drawn uniformly)
    low: int = 1  # each number is drawn uniformly from low..high
    high: int = 50
    target_low: int = 1  # the target is drawn from the reachable values in this range
    target_high: int = 100

    def __post_init__(self):
        if not self.counts or not all(2 <= c <= 6 for c in self.counts):
            raise ValueError(f"counts must be numbers of 2 to 6, got {self.counts}")
        if not 0 <= self.low <= self.high or not self.target_low <= self.target_high:
            raise ValueError("need 0 <= low <= high and target_low <= target_high")


@dataclass(frozen=True)
class Problem:
    numbers: tuple[int, ...]
    target: int
    solutions: int  # ordered expression trees that reach the target (demo/countdown/solver.py)
    additive: bool  # + and - alone reach the target

    @property
    def reference(self) -> str:
        return f"{','.join(map(str, self.numbers))}:{self.target}"

    @property
    def prompt(self) -> str:
        return self.reference + "="

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        """The same problem whatever the order of its numbers."""
        return tuple(sorted(self.numbers)), self.target

    @property
    def share(self) -> float:
        return self.solutions / trees(len(self.numbers))

    @property
    def label(self) -> str:
        return difficulty(self.share)


def difficulty(share: float) -> str:
    if share >= EASY_SHARE:
        return "easy"
    return "medium" if share >= HARD_SHARE else "hard"


def split_of(numbers: tuple[int, ...]) -> str:
    """The split a set of numbers belongs to (order does not matter)."""
    digest = hashlib.sha256(",".join(map(str, sorted(numbers))).encode()).digest()
    mille = int.from_bytes(digest[:8], "big") % 1000
    return next(name for name, (lo, hi) in SPLITS.items() if lo <= mille < hi)


def make_problem(rng: random.Random, spec: TaskSpec, split: str | None = None) -> Problem | None:
    """One draw: a problem, or None when the numbers are of another split or reach no target."""
    count = rng.choice(spec.counts)
    numbers = tuple(rng.randint(spec.low, spec.high) for _ in range(count))
    if split is not None and split_of(numbers) != split:
        return None
    reached = value_counts(numbers)[-1]
    targets = sorted(v for v in reached if spec.target_low <= v <= spec.target_high)
    if not targets:
        return None
    target = rng.choice(targets)
    return Problem(numbers, target, reached[target], additive(numbers, target))


def problems(
    n: int, split: str = "train", seed: int = 0, spec: TaskSpec = TaskSpec()
) -> list[Problem]:
    """``n`` distinct problems of ``split``, deterministic in (split, seed, spec)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    rng = random.Random(f"countdown:{split}:{seed}")
    out: list[Problem] = []
    seen: set = set()
    draws, limit = 0, 200 * n + 10_000
    while len(out) < n:
        draws += 1
        if draws > limit:
            raise ValueError(f"{split} holds fewer than {n} distinct problems of {spec}")
        p = make_problem(rng, spec, split)
        if p is not None and p.key not in seen:
            seen.add(p.key)
            out.append(p)
    return out


def heldout(n: int, spec: TaskSpec = TaskSpec()) -> list[Problem]:
    return problems(n, "heldout", HELDOUT_SEED, spec)


def probes(n: int, spec: TaskSpec = TaskSpec()) -> list[Problem]:
    return problems(n, "probe", PROBE_SEED, spec)


def rows(items: list[Problem]) -> list[dict]:
    """Data rows ({"prompt", "reference", "label"}) as the learner's data and probe sets read
    them."""
    return [{"prompt": p.prompt, "reference": p.reference, "label": p.label} for p in items]


@dataclass(frozen=True)
class Demonstrator:
    """What the warm-start imitates (probabilities per problem; see the module docstring)."""

    correct: float = 0.3  # writes a solution
    by_label: tuple[tuple[str, float], ...] = ()  # ("hard", 0.02): `correct` for that label
    reuse: float = 0.25  # a wrong answer uses a number twice (else it is a near miss)
    near: int = 4  # a near miss is the closest to the target of this many random expressions

    def rate(self, label: str) -> float:
        return dict(self.by_label).get(label, self.correct)

    def answer(self, p: Problem, rng: random.Random) -> str:
        if rng.random() < self.rate(p.label):
            return to_text(sample_solution(p.numbers, p.target, rng))
        if rng.random() < self.reuse:
            slip = reuse_slip(p, rng)
            if slip is not None:
                return slip
        return near_miss(p, rng, self.near)


def reuse_slip(p: Problem, rng: random.Random) -> str | None:
    """A solution with one number replaced by another of the given ones (None when all the
    numbers are equal)."""
    tree = sample_solution(p.numbers, p.target, rng)
    values = leaves(tree)
    i = rng.randrange(len(values))
    others = sorted({x for x in values if x != values[i]})
    if not others:
        return None
    return to_text(_replace_leaf(tree, i, rng.choice(others))[0])


def _replace_leaf(tree: Tree, index: int, new: int) -> tuple[Tree, int]:
    """``tree`` with its ``index``-th leaf (left to right) set to ``new``; (tree, leaves seen)."""
    if isinstance(tree, int):
        return (new if index == 0 else tree), 1
    op, left, right = tree
    left, k = _replace_leaf(left, index, new)
    right, m = _replace_leaf(right, index - k, new)
    return (op, left, right), k + m


def near_miss(p: Problem, rng: random.Random, near: int = 4) -> str:
    """Of ``near`` random expressions over the numbers whose divisions are whole and whose value
    is not the target, the closest to it."""
    best, best_gap = None, None
    for _ in range(near):
        for _ in range(20):
            tree = random_tree(p.numbers, rng)
            v = value(tree)
            if v is not None and v != p.target:
                break
        else:
            continue
        if best_gap is None or abs(v - p.target) < best_gap:
            best, best_gap = tree, abs(v - p.target)
    if best is None:  # every draw divided badly or hit the target (practically never)
        best = random_tree(p.numbers, rng)
    return to_text(best)


def label_stats(n: int = 2000, seed: int = 0, spec: TaskSpec = TaskSpec()) -> dict:
    """How ``n`` train problems spread over the labels, by count of numbers, and the shares
    that + and - alone solve."""
    items = problems(n, "train", seed, spec)
    by = Counter((len(p.numbers), p.label) for p in items)
    return {
        "problems": n,
        "labels": {lab: sum(p.label == lab for p in items) for lab in LABELS},
        "by_count": {
            str(c): {lab: by[(c, lab)] for lab in LABELS} for c in sorted(set(spec.counts))
        },
        "additive": {lab: sum(p.additive for p in items if p.label == lab) for lab in LABELS},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Countdown problems: the label distribution.")
    ap.add_argument("--stats", type=int, default=2000, help="train problems to count")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(json.dumps(label_stats(args.stats, args.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
