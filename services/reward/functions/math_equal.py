"""When two extracted answers are equal: brorl's rules in front of math-verify.

``quick_verdict`` runs in the service process and settles what needs no sympy: empty answers, plain
integers (the RL hot path), identical strings, text answers, exact fractions, shape mismatches,
over-long answers. Everything else goes to ``math_symbolic.verdict``, which runs in a worker process
(``math_workers``) because math-verify and sympy can take unbounded time.

Stricter than math-verify's defaults, because a reward that says "equal" wrongly is learned:

* a text answer is compared as text (``\\text{}`` unwrapped, case and spacing normalised), never
  as a product of symbols;
* an answer that does not parse equals nothing (no string fallback);
* a list of plain numbers is ordered ("10, 4, -2" is not "4, 10, -2", as MATH's own grader says);
* the parser sees only the extracted answer, so "3 or 4" stays the set {3, 4}.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_ANSWER_CHARS = 1000  # longer extracted answers are not parsed (no real answer is this long)

EQUAL, DIFFERENT, UNPARSED, BAD_REFERENCE = "equal", "different", "unparsed", "bad_reference"

_INT = re.compile(r"[-+]?\d+")
_TEXT_CMD = re.compile(
    r"\\(?:text(?:bf|it|rm|sf|tt|normal|up)?|mbox|math(?:rm|bf|it|sf|tt)|operatorname|textsc)\s*\{"
)
SPACING = re.compile(r"\\[,!;: ]|~|\\q?quad\b")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTERS = re.compile(r"[A-Za-z]+")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_PROSE = re.compile(r"(?=[A-Za-z]*[a-z][A-Za-z]*[a-z])[A-Za-z]{4,}")
_ENV_OR_SUBSCRIPT = re.compile(r"\\(?:begin|end)\{[^{}]*\}|_\{[^{}]*\}|_[A-Za-z0-9]")
# A unit written after the answer: math-verify drops it when units are stripped.
TRAILING_UNIT = re.compile(
    r"\\(?:text(?:bf|it|rm|normal)?|mbox|mathrm)\s*\{[^{}]*\}(?:\^\d|\^\{\d\})?\s*$"
)
# Words that are mathematics, not prose, when written without a backslash.
_MATH_WORDS = frozenset(
    "sqrt sin cos tan sec csc cot log ln exp lim max min gcd lcm mod deg det arcsin arccos "
    "arctan sinh cosh tanh pi inf infty infinity and or frac dfrac cdot times".split()
)
_SHORT_WORDS = frozenset("yes no odd all none any not one two six ten true false".split())
PLAIN_NUMBER = re.compile(
    r"[-+]?[$€£]?(?:\d{1,3}(?:[ ,]\d{3})+|\d+)(?:[.,]\d+)?[$€£]?\s*(?:%|percent|percentage|pct)?"
    r"|[-+]?\.\d+\s*%?",
    re.IGNORECASE,
)
NUMBER_WITH_UNIT = re.compile(r"([-+]?[$€£]?\d[\d,.]*\s*%?)\s+[A-Za-z][A-Za-z .'/-]*")
_RELATION = re.compile(
    r"[=<>≤≥≠]|\\(?:le|ge|leq|geq|lt|gt|ne|neq|approx|sim|equiv|in|to)(?![A-Za-z])"
)
# A command with its name, and the content of text-like commands (their letters are not variables).
_COMMAND_WITH_NAME = re.compile(
    r"\\(?:text\w*|mbox|math\w+|operatorname|begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+"
)
_VARIABLE = re.compile(r"[A-Za-z]")
_EXACT = re.compile(
    r"(?P<sign>[-+]?)(?:(?P<int>\d{1,3}(?:,\d{3})+|\d{1,30})"
    r"|\\[dt]?frac(?:\{(?P<n1>\d{1,30})\}\{(?P<d1>\d{1,30})\}|(?P<n2>\d)(?P<d2>\d))"
    r"|(?P<n3>\d{1,30})/(?P<d3>\d{1,30}))"
)


@dataclass(frozen=True)
class Options:
    """What a ``math_answer`` instance treats as equal (the run config's settings)."""

    float_rounding: int = 6  # decimal places floats are rounded to (math-verify)
    strict: bool = True  # variables matter, a set is not a tuple (math-verify's strict)
    percent: str = "either"  # either: 10% equals 0.1 and 10; value: only 0.1
    units: str = "strip"  # strip: "10 cm" is 10; keep: a unit is part of the answer
    symbolic: bool = True  # false: only numbers (exactly) and text


# ------------------------------------------------------------------------- in the service process


def quick_verdict(pred: str, gold: str, opts: Options) -> str | None:
    """EQUAL / DIFFERENT / UNPARSED when no parser is needed, else None (send to a worker)."""
    p, g = pred.strip(), gold.strip()
    if not g:
        return BAD_REFERENCE
    if not p:
        return UNPARSED
    if _INT.fullmatch(p) and _INT.fullmatch(g):  # the hot path: never touches sympy
        return EQUAL if int_key(p) == int_key(g) else DIFFERENT
    # Identical answers are equal, but "\text{}" or "}{" equal nothing, not even themselves.
    if p == g and _ALNUM.search(normalize_text(p)):
        return EQUAL
    if len(g) > MAX_ANSWER_CHARS:  # no formula answer is this long: a text answer, or nothing
        tg = normalize_text(g)
        return EQUAL if tg and normalize_text(p) == tg else DIFFERENT
    if len(p) > MAX_ANSWER_CHARS:
        return UNPARSED
    if is_text_answer(p, opts.units) or is_text_answer(g, opts.units):
        tp, tg = normalize_text(p), normalize_text(g)
        return EQUAL if tp and tp == tg else DIFFERENT
    x, y = exact_number(p), exact_number(g)
    if x is not None and y is not None:  # math-verify compares two rationals exactly, too
        return EQUAL if x == y else DIFFERENT
    if (y is not None or PLAIN_NUMBER.fullmatch(g)) and (_never_a_number(p) or _has_variable(p)):
        return DIFFERENT
    if not opts.symbolic:
        return _plain_number_verdict(p, g, opts)
    return None


def _never_a_number(s: str) -> bool:
    """A matrix, or a pair/tuple/interval of different parts: math-verify never finds one equal to
    a number (a closed ``[a, a]`` is the set {a}, so it is left to math-verify)."""
    if "\\begin{" in s and "matrix" in s:
        return True
    body = s.strip()
    if body[:1] not in "([" or body[-1:] not in ")]" or not _closing_pair(body):
        return False
    parts = top_level_split(body[1:-1])
    return len(parts) >= 2 and len(set(parts)) == len(parts)


def _has_variable(s: str) -> bool:
    """A formula with a free variable (``x^{2}+7x``, ``\\frac{\\sqrt{y}}{2}``), which brorl never
    takes for a number, even when the variable cancels (math-verify's ``simplify`` would accept
    ``\\frac{3x}{4x}`` for 3/4). Not: an equation or relation (``x = 3/4`` states a value), letters
    that are constants (``e``, ``i``), or a unit at the end (``5 m``)."""
    if _RELATION.search(s) or TRAILING_UNIT.search(s) or NUMBER_WITH_UNIT.fullmatch(s.strip()):
        return False
    plain = _COMMAND_WITH_NAME.sub(" ", s)
    return any(ch not in "eEiI" for ch in _VARIABLE.findall(plain))


def _closing_pair(s: str) -> bool:
    """The first bracket of ``s`` closes at its last character (not "(1)+(2)")."""
    depth = 0
    for i, ch in enumerate(s):
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if depth == 0:
            return i == len(s) - 1
    return False


def exact_number(s: str) -> Fraction | None:
    """An integer or a fraction of integers, as written in an answer ("-1,234", ``14{,}916``,
    ``\\frac{3}{4}``, ``\\dfrac34``, "7/8", ``\\$5``); None for anything else (decimals and
    percents go to math-verify, whose rounding rules are its own)."""
    # Spaces stay: "32, 349" is the set {32, 349}, not 32349.
    t = s.strip().replace("{,}", ",").replace("\\$", "").replace("\\!", "")
    m = _EXACT.fullmatch(t)
    if m is None:
        return None
    sign = -1 if m.group("sign") == "-" else 1
    if m.group("int") is not None:
        return sign * Fraction(int(m.group("int").replace(",", "")))
    num, den = (m.group("n1"), m.group("d1")) if m.group("n1") else (m.group("n2"), m.group("d2"))
    num = num or m.group("n3")
    den = den or m.group("d3")
    return sign * Fraction(int(num), int(den)) if int(den) else None


def int_key(s: str) -> tuple[bool, str]:
    """Sign and digits without leading zeros: compares integers of any length without int()
    (which refuses more than 4300 digits)."""
    digits = s.lstrip("+-").lstrip("0") or "0"
    return (s.startswith("-") and digits != "0", digits)


def unwrap_text_commands(s: str) -> str:
    """``\\text{odd}`` → ``odd`` (the content is kept: deleting it would make all text equal)."""
    out = s
    for _ in range(8):  # nested commands, innermost last; more nesting than this is not an answer
        m = _TEXT_CMD.search(out)
        if m is None:
            return out
        depth, i = 1, m.end()
        while i < len(out) and depth:
            depth += {"{": 1, "}": -1}.get(out[i], 0)
            i += 1
        out = out[: m.start()] + out[m.end() : i - 1 if depth == 0 else i] + out[i:]
    return out


def is_text_answer(s: str, units: str = "strip") -> bool:
    """A word answer ("odd", ``\\text{(A)}``, "the midpoints form a hexagon"), not a formula.

    Wholly wrapped in a text command, or holding a prose word outside LaTeX commands, environment
    names and subscripts: four or more letters with two lower-case ones ("hexagon", not "MBCN"),
    or an answer made of short words only ("yes", "no"). A number followed by words or by a
    ``\\text{}`` is a number with a unit when units are stripped."""
    body = s.strip().strip("$").strip()
    bare = body[1:-1].strip() if body[:1] == "(" and body[-1:] == ")" else body
    m = _TEXT_CMD.match(bare)
    if m is not None and _closing(bare, m.end() - 1) == len(bare) - 1:
        return bool(re.search(r"[A-Za-z]", bare[m.end() : -1]))
    if units == "strip" and TRAILING_UNIT.search(body) and TRAILING_UNIT.sub("", body).strip():
        body = TRAILING_UNIT.sub("", body)
    plain = _ENV_OR_SUBSCRIPT.sub(" ", unwrap_text_commands(body))
    plain = _COMMAND.sub(" ", plain)
    if units == "strip" and NUMBER_WITH_UNIT.fullmatch(plain.strip()):
        return False
    words = [w for w in _LETTERS.findall(plain) if w.lower() not in _MATH_WORDS]
    if any(_PROSE.fullmatch(w) for w in words):
        return True
    return (
        bool(words)
        and all(w.lower() in _SHORT_WORDS for w in words)
        and not re.search(r"\d", plain)
    )


def _closing(s: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(s)):
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return i
    return -1


def normalize_text(s: str) -> str:
    """Text answers compare on this: commands unwrapped, math delimiters and spacing commands
    gone, lower case, single spaces, no trailing period, "(a)" → "a"."""
    t = unwrap_text_commands(s)
    for old in ("\\(", "\\)", "\\[", "\\]", "$", "**"):
        t = t.replace(old, " ")
    t = SPACING.sub(" ", t).replace("\\%", "%")
    t = " ".join(t.lower().split()).strip(" .")
    if re.fullmatch(r"\(\s*[a-z0-9]{1,2}\s*\)", t):
        t = t.strip("() ")
    return t


def _plain_number_verdict(p: str, g: str, opts: Options) -> str:
    """``symbolic: false``: plain numbers compared exactly (decimals rounded), anything else as
    text."""
    x, y = _plain_number(p), _plain_number(g)
    if x is None or y is None:
        return EQUAL if normalize_text(p) == normalize_text(g) else DIFFERENT
    if x.denominator != 1 or y.denominator != 1:
        return (
            EQUAL if round(x, opts.float_rounding) == round(y, opts.float_rounding) else DIFFERENT
        )
    return EQUAL if x == y else DIFFERENT


def _plain_number(s: str) -> Fraction | None:
    s = s.replace(" ", "")
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    m = re.fullmatch(r"([-+]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", s)
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) == "-" else value
        return Fraction(s) if re.fullmatch(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?", s) else None
    except (ValueError, ZeroDivisionError):
        return None


def top_level_split(s: str) -> list[str]:
    """Split at commas and semicolons outside brackets; "1,000" and ``14{,}916`` are numbers."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in ",;" and depth == 0:
            if ch == "," and re.match(r"\d{3}(?!\d)", s[i + 1 :]) and s[i - 1 : i].isdigit():
                continue
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return [p for p in (p.strip() for p in parts) if p]
