"""The exact solver of Countdown (pure Python): which values the numbers reach, by how many
expressions, one solution drawn uniformly, and expressions written as text.

An expression is a binary tree over the given numbers, each leaf used exactly once, with the
operations + - * / where a division must come out whole (the reward function's rule,
services/reward/functions/countdown.py: exact division, no unary minus). A tree is a number
(a leaf) or ``(op, left, right)``.

Counts are of *ordered* trees over the numbers' positions: for n numbers there are
``trees(n) = n! * Catalan(n - 1) * 4 ** (n - 1)`` of them (192 for 3 numbers, 7680 for 4), and
``a+b`` and ``b+a`` count twice. ``solutions / trees(n)`` is then the chance that an expression
drawn uniformly (an order of the numbers, a shape, the operators) reaches the target, which is
the problem's difficulty (demo/countdown/task.py). The table of value counts is built over
subsets of positions, smallest first (dynamic programming), never by enumerating the trees.
"""

from __future__ import annotations

import math
import random
from typing import Union

Tree = Union[int, tuple]  # a number, or (op, left tree, right tree)
OPS = "+-*/"
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def apply(op: str, a: int, b: int) -> int | None:
    """``a op b``, or None for a division by zero or one that does not come out whole."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


def trees(n: int) -> int:
    """How many ordered expression trees n numbers have (shapes x leaf orders x operators)."""
    return math.factorial(n) * math.comb(2 * n - 2, n - 1) // n * 4 ** (n - 1)


def _subsets(mask: int):
    """Every non-empty proper subset of ``mask``."""
    sub = (mask - 1) & mask
    while sub:
        yield sub
        sub = (sub - 1) & mask


def value_counts(numbers: tuple[int, ...]) -> list[dict[int, int]]:
    """For every subset of positions (a bit mask), value → how many ordered trees over those
    numbers reach it (trees with a bad division left out). ``[-1]`` is the whole set's."""
    n = len(numbers)
    if not 1 <= n <= 6:
        raise ValueError(f"the solver takes 1 to 6 numbers, got {n}")
    table: list[dict[int, int]] = [{} for _ in range(1 << n)]
    for i, x in enumerate(numbers):
        table[1 << i] = {x: 1}
    for mask in sorted(range(1, 1 << n), key=lambda m: bin(m).count("1")):
        if mask & (mask - 1) == 0:
            continue  # a single number
        acc: dict[int, int] = {}
        for left in _subsets(mask):
            right_values = table[mask ^ left].items()
            for a, ca in table[left].items():
                for b, cb in right_values:
                    for op in OPS:
                        v = apply(op, a, b)
                        if v is not None:
                            acc[v] = acc.get(v, 0) + ca * cb
        table[mask] = acc
    return table


def count_solutions(numbers: tuple[int, ...], target: int) -> int:
    """How many ordered expression trees over ``numbers`` equal ``target`` (0: unsolvable)."""
    return value_counts(numbers)[-1].get(target, 0)


def additive(numbers: tuple[int, ...], target: int) -> bool:
    """Whether + and - alone reach ``target`` (some signs, not all minus, sum to it)."""
    n = len(numbers)
    for signs in range(1, 1 << n):  # bit i set: numbers[i] is added
        if sum(x if signs >> i & 1 else -x for i, x in enumerate(numbers)) == target:
            return True
    return False


def sample_solution(
    numbers: tuple[int, ...],
    target: int,
    rng: random.Random,
    table: list[dict[int, int]] | None = None,
) -> Tree:
    """One of the trees that reach ``target``, each with the same chance; ValueError when none
    does. ``table`` is ``value_counts(numbers)``, when the caller keeps it."""
    table = table if table is not None else value_counts(numbers)
    if target not in table[-1]:
        raise ValueError(f"{numbers} cannot reach {target}")
    return _draw(numbers, table, (1 << len(numbers)) - 1, target, rng)


def _draw(numbers, table, mask: int, value: int, rng: random.Random) -> Tree:
    if mask & (mask - 1) == 0:
        return numbers[mask.bit_length() - 1]
    ways, weights = [], []
    for left in _subsets(mask):
        right = mask ^ left
        for a, ca in table[left].items():
            for b, cb in table[right].items():
                for op in OPS:
                    if apply(op, a, b) == value:
                        ways.append((op, left, a, right, b))
                        weights.append(ca * cb)
    op, left, a, right, b = rng.choices(ways, weights)[0]
    return (op, _draw(numbers, table, left, a, rng), _draw(numbers, table, right, b, rng))


def random_tree(numbers: tuple[int, ...], rng: random.Random) -> Tree:
    """A tree over ``numbers`` in a random order, with a random shape and random operators
    (its divisions may be bad: see ``value``)."""
    leaves = list(numbers)
    rng.shuffle(leaves)

    def build(items: list[int]) -> Tree:
        if len(items) == 1:
            return items[0]
        k = rng.randint(1, len(items) - 1)
        return (rng.choice(OPS), build(items[:k]), build(items[k:]))

    return build(leaves)


def value(tree: Tree) -> int | None:
    """The tree's value, or None when one of its divisions is by zero or not whole."""
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    a, b = value(left), value(right)
    return None if a is None or b is None else apply(op, a, b)


def leaves(tree: Tree) -> list[int]:
    return [tree] if isinstance(tree, int) else leaves(tree[1]) + leaves(tree[2])


def to_text(tree: Tree) -> str:
    """The tree as an expression with only the parentheses it needs (``(2+3)*4``, ``7-(5-1)``);
    read back by the reward function's grammar it has the same value."""
    return _text(tree)[0]


def _text(tree: Tree) -> tuple[str, int]:
    if isinstance(tree, int):
        return str(tree), 3
    op, left, right = tree
    p = PRECEDENCE[op]
    lt, lp = _text(left)
    rt, rp = _text(right)
    if lp < p:
        lt = f"({lt})"
    # a right operand of the same precedence keeps its parentheses (7-(5-1), 8/(4/2)), except
    # under + and * of the same operator, where dropping them changes no value (2+(3+4))
    same_assoc = not isinstance(right, int) and right[0] == op and op in "+*"
    if rp < p or (rp == p and not same_assoc):
        rt = f"({rt})"
    return f"{lt}{op}{rt}", p
