"""Synthetic arithmetic with verifiable answers (pure Python, no torch).

A problem is a prompt such as ``"47+385="`` and a reference answer ``"432"``. Train and
held-out problems come from disjoint seeds and held-out pairs are never in the train set.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_problem(rng: random.Random, max_digits: int, ops: str) -> Problem:
    op = rng.choice(ops)
    a = rng.randrange(10 ** rng.randint(1, max_digits))
    b = rng.randrange(10 ** rng.randint(1, max_digits))
    return Problem(prompt=f"{a}{op}{b}=", answer=str(OPS[op](a, b)))


def problems(n: int, seed: int, max_digits: int = 3, ops: str = "+",
             exclude: set[str] | None = None) -> list[Problem]:
    """n distinct problems drawn with ``seed``; prompts in ``exclude`` are skipped."""
    rng = random.Random(seed)
    seen: set[str] = set(exclude or ())
    out: list[Problem] = []
    while len(out) < n:
        p = make_problem(rng, max_digits, ops)
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return out


def heldout_problems(n: int, max_digits: int = 3, ops: str = "+") -> list[Problem]:
    """The fixed held-out set (seed 1_000_003); train data must exclude these prompts."""
    return problems(n, seed=1_000_003, max_digits=max_digits, ops=ops)
