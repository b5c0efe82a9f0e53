"""``countdown``: 1 if the completion's expression uses each of the given numbers exactly once and
equals the target, else 0 (docs/rewards.md "countdown").

Grammar (read without ``eval``, by one iterative shunting-yard pass, so no nesting recurses)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := number | "(" expr ")"
    number := "0" | [1-9][0-9]*        ASCII digits: no sign, no leading zero, no decimal point

``×`` and ``÷`` are read as ``*`` and ``/``, ``−`` (U+2212) as ``-``; whitespace between tokens is
ignored. A ``-`` where a number is expected (unary minus: ``-3+5``, ``2*-3``) is refused, so every
expression is a tree of binary operations over the numbers. Arithmetic is exact
(``fractions.Fraction``) and every division must come out whole: ``7/2*4`` is refused even
though its value would be 14.

Which text is the expression: the completion's text after its last ``=``, or the whole
completion when it has none, surrounding whitespace stripped. A completion that restates the
target (``50+25+3=78``) is therefore read as ``78``.

The reference names the numbers, then ``:`` and the target: ``3,7,25,50:78`` (commas and/or
whitespace between the numbers; a trailing ``=``, the prompt's form, is allowed).

Every refusal of a completion is a verdict (status ok, reward 0 or ``format_weight``) whose
``detail`` starts with one of the codes of ``Verdict``; only an unreadable reference is status
error. The limits come before any parsing: a completion longer than ``max_chars`` is not read,
nesting deeper than ``max_depth`` stops the pass, and a number literal is compared as a string
with the given numbers, so a literal of 5000 digits is never converted.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

from brorl.contract import RewardStatus
from services.reward.base import Score, ScoreItem
from services.reward.config import BUILTIN_FUNCTIONS, CountdownSpec


class Verdict:
    """The first word of a countdown score's detail: what was decided about the completion."""

    CORRECT = "correct"
    WRONG_VALUE = "wrong_value"  # well formed, the right numbers, another value
    NO_EXPRESSION = "no_expression"  # nothing (but whitespace) to read
    TOO_LONG = "too_long"  # the completion is longer than max_chars
    BAD_CHARACTER = "bad_character"  # a character outside the grammar
    SYNTAX = "syntax"  # the grammar does not read it (missing operator, unbalanced, ...)
    UNARY_MINUS = "unary_minus"  # a "-" where a number is expected
    TOO_DEEP = "too_deep"  # parentheses nested deeper than max_depth
    UNKNOWN_NUMBER = "unknown_number"  # a number that is not one of the given ones
    REUSED_NUMBER = "reused_number"  # a given number used more often than given
    UNUSED_NUMBER = "unused_number"  # a given number left out
    DIVISION_BY_ZERO = "division_by_zero"
    INEXACT_DIVISION = "inexact_division"  # a quotient that is not a whole number

    # what the grammar read (the format component): all but the first six above
    WELL_FORMED = (CORRECT, WRONG_VALUE, UNKNOWN_NUMBER, REUSED_NUMBER, UNUSED_NUMBER)
    WELL_FORMED += (DIVISION_BY_ZERO, INEXACT_DIVISION)


OPERATORS = {"+": "+", "-": "-", "\u2212": "-", "*": "*", "\u00d7": "*", "/": "/", "\u00f7": "/"}
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}  # all left-associative
DIGITS = frozenset("0123456789")
MAX_REFERENCE_CHARS = 1000
_REFERENCE = re.compile(r"\s*([0-9]+(?:(?:\s*,\s*|\s+)[0-9]+)*)\s*:\s*([0-9]+)\s*=?\s*")


class Rejected(Exception):
    def __init__(self, verdict: str, detail: str):
        super().__init__(f"{verdict}: {detail}")
        self.verdict, self.detail = verdict, detail


def read_reference(reference: str) -> tuple[tuple[int, ...], int]:
    """``"3,7,25,50:78"`` → ((3, 7, 25, 50), 78); ValueError saying what is expected."""
    m = _REFERENCE.fullmatch(reference) if len(reference) <= MAX_REFERENCE_CHARS else None
    if m is None:
        raise ValueError(
            "the reference is not 'numbers:target' such as '3,7,25,50:78' "
            f"(at most {MAX_REFERENCE_CHARS} characters)"
        )
    numbers = tuple(int(x) for x in re.split(r"[,\s]+", m.group(1)))
    return numbers, int(m.group(2))


def extract(completion: str) -> str:
    """The expression of a completion: its text after the last "=" (the whole completion when it
    has none), surrounding whitespace stripped."""
    return completion[completion.rfind("=") + 1 :].strip()


def _short(text: str, n: int = 24) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} characters)"


def to_rpn(text: str, max_depth: int) -> list[str]:
    """The expression in reverse Polish order: number literals (digit strings) and the operators
    "+-*/"; Rejected (syntax, unary_minus, too_deep, bad_character) at the first problem."""
    out: list[str] = []
    stack: list[str] = []  # operators and "("
    depth, expect_number, i = 0, True, 0
    while i < len(text):
        ch = text[i]
        if ch in DIGITS:
            j = i
            while j < len(text) and text[j] in DIGITS:
                j += 1
            literal = text[i:j]
            if not expect_number:
                raise Rejected(Verdict.SYNTAX, f"no operator before the number at {i}")
            if len(literal) > 1 and literal[0] == "0":
                raise Rejected(Verdict.SYNTAX, f"the number {_short(literal)} has a leading zero")
            out.append(literal)
            expect_number, i = False, j
            continue
        op = OPERATORS.get(ch)
        if ch.isspace():
            pass
        elif op is not None:
            if expect_number:
                if op == "-":
                    raise Rejected(Verdict.UNARY_MINUS, f"'-' at {i} has no left operand")
                raise Rejected(Verdict.SYNTAX, f"{ch!r} at {i} has no left operand")
            while stack and stack[-1] != "(" and PRECEDENCE[stack[-1]] >= PRECEDENCE[op]:
                out.append(stack.pop())
            stack.append(op)
            expect_number = True
        elif ch == "(":
            if not expect_number:
                raise Rejected(Verdict.SYNTAX, f"no operator before '(' at {i}")
            depth += 1
            if depth > max_depth:
                raise Rejected(Verdict.TOO_DEEP, f"parentheses nested deeper than {max_depth}")
            stack.append("(")
        elif ch == ")":
            if expect_number:
                raise Rejected(Verdict.SYNTAX, f"')' at {i} where a number is expected")
            while stack and stack[-1] != "(":
                out.append(stack.pop())
            if not stack:
                raise Rejected(Verdict.SYNTAX, f"')' at {i} closes nothing")
            stack.pop()
            depth -= 1
        else:
            raise Rejected(Verdict.BAD_CHARACTER, f"{ch!r} at {i} is not part of the grammar")
        i += 1
    if expect_number:
        raise Rejected(Verdict.SYNTAX, "the expression ends where a number is expected")
    if "(" in stack:
        raise Rejected(Verdict.SYNTAX, "a '(' is never closed")
    return out + stack[::-1]


def check_numbers(rpn: list[str], numbers: tuple[int, ...]) -> None:
    """Rejected unless the literals of ``rpn`` are exactly the multiset ``numbers``."""
    given = Counter(str(n) for n in numbers)
    used = Counter(tok for tok in rpn if tok not in PRECEDENCE)
    for literal, k in used.items():
        if literal not in given:
            raise Rejected(
                Verdict.UNKNOWN_NUMBER, f"{_short(literal)} is not one of the given numbers"
            )
        if k > given[literal]:
            raise Rejected(
                Verdict.REUSED_NUMBER, f"{literal} is used {k} times, given {given[literal]}"
            )
    unused = sorted((given - used).elements(), key=int)
    if unused:
        raise Rejected(Verdict.UNUSED_NUMBER, f"not used: {', '.join(unused)}")


def evaluate(rpn: list[str]) -> Fraction:
    """The value of a well-formed ``rpn``; Rejected at a division by zero or a quotient that is
    not whole."""
    stack: list[Fraction] = []
    for tok in rpn:
        if tok not in PRECEDENCE:
            stack.append(Fraction(int(tok)))
            continue
        b, a = stack.pop(), stack.pop()
        if tok == "+":
            stack.append(a + b)
        elif tok == "-":
            stack.append(a - b)
        elif tok == "*":
            stack.append(a * b)
        elif b == 0:
            raise Rejected(Verdict.DIVISION_BY_ZERO, f"{a}/{b}")
        else:
            q = a / b
            if q.denominator != 1:
                raise Rejected(Verdict.INEXACT_DIVISION, f"{a}/{b} = {q} is not a whole number")
            stack.append(q)
    return stack[0]


def check(
    completion: str,
    numbers: tuple[int, ...],
    target: int,
    max_chars: int = 1000,
    max_depth: int = 32,
) -> tuple[str, str]:
    """(verdict, detail) of a completion against the numbers and the target."""
    if len(completion) > max_chars:
        return Verdict.TOO_LONG, f"{len(completion)} characters, more than {max_chars}"
    text = extract(completion)
    if not text:
        return Verdict.NO_EXPRESSION, "nothing to read after the last '='"
    try:
        rpn = to_rpn(text, max_depth)
        check_numbers(rpn, numbers)
        value = evaluate(rpn)
    except Rejected as r:
        return r.verdict, r.detail
    if value != target:
        return Verdict.WRONG_VALUE, f"the expression is {value}, the target {target}"
    return Verdict.CORRECT, ""


class Countdown:
    name = "countdown"
    description = BUILTIN_FUNCTIONS["countdown"].description

    def __init__(self, name: str = "countdown", spec: CountdownSpec | None = None):
        self.name, self.spec = name, spec or CountdownSpec()

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        done: dict[tuple[str, str], Score] = {}  # a group's identical paths are read once
        out = []
        for item in items:
            key = (item.completion, item.reference)
            if key not in done:
                done[key] = self._score(item.completion, item.reference)
            s = done[key]
            out.append(Score(s.reward, s.status, s.detail, dict(s.components)))
        return out

    def _score(self, completion: str, reference: str) -> Score:
        try:
            numbers, target = read_reference(reference)
        except ValueError as exc:
            return Score(0.0, RewardStatus.ERROR, str(exc))
        verdict, detail = check(
            completion, numbers, target, self.spec.max_chars, self.spec.max_depth
        )
        well_formed = float(verdict in Verdict.WELL_FORMED)
        components = {"correct": float(verdict == Verdict.CORRECT), "format": well_formed}
        if verdict == Verdict.CORRECT:
            return Score(1.0, components=components)
        reward = self.spec.format_weight * well_formed
        return Score(reward, detail=f"{verdict}: {detail}", components=components)
