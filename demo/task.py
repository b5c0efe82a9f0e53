"""Synthetic arithmetic with verifiable answers (pure Python, no torch).

A problem is a prompt such as ``"47+385="`` and a reference answer ``"432"``. Train and
held-out problems come from disjoint seeds and held-out pairs are never in the train set.

Operands: with ``min_digits == 1`` (the default) each operand is drawn below
``10 ** d`` for ``d`` uniform in ``1..max_digits`` (so small numbers are common); with
``min_digits > 1`` each operand has exactly ``d`` digits, ``d`` uniform in
``min_digits..max_digits``.

``teacher_answer`` is the demonstrator used for the supervised warm-start. It can be made
deliberately flawed (it forgets carries), so that the warm-started model is partial in a
way a verifier-based RL phase can repair.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
HELDOUT_SEED = 1_000_003


def _operand(rng: random.Random, min_digits: int, max_digits: int) -> int:
    if min_digits == 1:  # the original draw; kept call-for-call so old sets stay identical
        return rng.randrange(10 ** rng.randint(1, max_digits))
    d = rng.randint(min_digits, max_digits)
    return rng.randrange(10 ** (d - 1), 10**d)


def make_problem(rng: random.Random, max_digits: int, ops: str, min_digits: int = 1) -> Problem:
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    op = rng.choice(ops)
    a = _operand(rng, min_digits, max_digits)
    b = _operand(rng, min_digits, max_digits)
    return Problem(prompt=f"{a}{op}{b}=", answer=str(OPS[op](a, b)))


def count_distinct(max_digits: int, ops: str, min_digits: int = 1) -> int:
    """How many distinct prompts ``make_problem`` can produce."""
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    return (10**max_digits - low) ** 2 * len(set(ops))


def all_problems(max_digits: int, ops: str, min_digits: int = 1) -> list[Problem]:
    """Every problem of the distribution, in a fixed order."""
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    values = range(low, 10**max_digits)
    return [
        Problem(f"{a}{op}{b}=", str(OPS[op](a, b)))
        for op in dict.fromkeys(ops)
        for a in values
        for b in values
    ]


def problems(
    n: int,
    seed: int,
    max_digits: int = 3,
    ops: str = "+",
    exclude: set[str] | None = None,
    min_digits: int = 1,
) -> list[Problem]:
    """n distinct problems drawn with ``seed``; prompts in ``exclude`` are skipped.

    Draws by rejection; when the space is nearly used up (many rejections in a row) the
    rest is taken from a seeded shuffle of the problems not yet drawn, so even the whole
    space can be drawn. Asking for more than the space holds raises ``ValueError``.
    """
    rng = random.Random(seed)
    seen: set[str] = set(exclude or ())
    out: list[Problem] = []
    misses = 0
    while len(out) < n:
        p = make_problem(rng, max_digits, ops, min_digits)
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
            misses = 0
            continue
        misses += 1
        if misses > 2_000:  # the space is nearly used up: shuffle what is left
            rest = [q for q in all_problems(max_digits, ops, min_digits) if q.prompt not in seen]
            if len(rest) < n - len(out):
                raise ValueError(
                    f"cannot draw {n} distinct problems with max_digits={max_digits}, "
                    f"min_digits={min_digits}, ops={ops!r}: only {len(out) + len(rest)} "
                    "exist outside the excluded set"
                )
            rng.shuffle(rest)
            out.extend(rest[: n - len(out)])
    return out


def heldout_problems(
    n: int, max_digits: int = 3, ops: str = "+", min_digits: int = 1
) -> list[Problem]:
    """The fixed held-out set (seed 1_000_003); train data must exclude these prompts.

    ``heldout_problems(n)`` is a prefix of ``heldout_problems(m)`` for ``n <= m``.
    """
    return problems(n, seed=HELDOUT_SEED, max_digits=max_digits, ops=ops, min_digits=min_digits)


def column_sum(
    a: int,
    b: int,
    *,
    carry_drop: float = 0.0,
    final_carry_drop: float = 0.0,
    rng: random.Random | None = None,
) -> str:
    """``a + b`` by column addition, least significant digit first.

    A flawed demonstrator forgets carries: every carry with probability ``carry_drop``,
    and the final carry (the leading ``1`` of an overflowing sum) with probability
    ``final_carry_drop`` on top. Draws come from ``rng``; leading zeros are stripped.
    """
    if a < 0 or b < 0:
        raise ValueError("column_sum takes non-negative operands")
    if (carry_drop or final_carry_drop) and rng is None:
        raise ValueError("a flawed column_sum needs an rng")
    digits: list[int] = []
    carry = 0
    while a or b or carry:
        s = a % 10 + b % 10 + carry
        digits.append(s % 10)
        carry = 1 if s >= 10 else 0
        a, b = a // 10, b // 10
        if carry and carry_drop and rng.random() < carry_drop:
            carry = 0
        if carry and final_carry_drop and not (a or b) and rng.random() < final_carry_drop:
            carry = 0
    return "".join(map(str, reversed(digits))).lstrip("0") or "0"


def answer_width(max_digits: int, ops: str) -> int:
    """Characters in the longest non-negative answer the task can produce."""
    widths = {"+": max_digits + 1, "-": max_digits, "*": 2 * max_digits}
    return max(widths[op] for op in set(ops))


def teacher_answer(
    problem: Problem,
    *,
    carry_drop: float = 0.0,
    final_carry_drop: float = 0.0,
    zero_pad: float = 0.0,
    pad_width: int | None = None,
    rng: random.Random | None = None,
) -> str:
    """The demonstrator's answer to ``problem``, drawn with ``rng``.

    Exact by default. Deliberate flaws, each applied independently:
    ``carry_drop`` / ``final_carry_drop``: additions forget carries (see ``column_sum``);
    ``zero_pad``: with this probability a non-negative answer is written zero-padded to
    ``pad_width`` characters (``"098"`` for 98) -- the right number in a form that exact
    match rejects.
    """
    answer = problem.answer
    if (carry_drop or final_carry_drop) and "+" in problem.prompt:
        a, b = problem.prompt.rstrip("=").split("+")
        answer = column_sum(
            int(a), int(b), carry_drop=carry_drop, final_carry_drop=final_carry_drop, rng=rng
        )
    if zero_pad:
        if rng is None or pad_width is None:
            raise ValueError("zero_pad needs an rng and a pad_width")
        if not answer.startswith("-") and rng.random() < zero_pad:
            answer = answer.zfill(pad_width)
    return answer
