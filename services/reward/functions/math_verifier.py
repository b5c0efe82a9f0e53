"""Rule rewards for math: final-answer extraction and numeric / symbolic comparison, and a
format reward.

Extraction order: the last ``\\boxed{...}`` (nested braces allowed), then "the answer is ...", then
the last number in the text. Comparison: plain integers are compared directly (the RL hot path: 512
short integer answers per group never touch sympy); then exact rationals (fractions, decimals,
percentages, thousands separators, ``\\frac``); then, for anything else, a guarded sympy parse
compared numerically (constants) or at random points (expressions with symbols).
"""

from __future__ import annotations

import math
import random
import re
from fractions import Fraction
from functools import lru_cache

from services.reward.base import Score, ScoreItem
from services.reward.config import BUILTIN_FUNCTIONS

_INT = re.compile(r"^[-+]?\d+$")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?%?|[-+]?\.\d+%?")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{[^{}]*\}")
_LEAD_VAR = re.compile(r"^[a-zA-Z]\s*=\s*")
# Names a symbolic answer may use; everything else is rejected before sympy sees the string.
_FUNCS = {"sqrt", "log", "ln", "exp", "sin", "cos", "tan", "pi", "abs"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SAFE_CHARS = re.compile(r"^[0-9A-Za-z+\-*/^(). ,]*$")


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the brace group opening at text[start] == '{', and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def _last_boxed(text: str) -> str | None:
    for cmd in ("\\boxed", "\\fbox"):
        pos = text.rfind(cmd)
        while pos != -1:
            rest = pos + len(cmd)
            while rest < len(text) and text[rest] == " ":
                rest += 1
            if rest < len(text) and text[rest] == "{":
                group = _braced(text, rest)
                if group is not None:
                    return group[0].strip()
            elif rest < len(text):  # "\boxed 5"
                return re.split(r"[\s$]", text[rest:], maxsplit=1)[0]
            pos = text.rfind(cmd, 0, pos)
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: \\boxed{...}, then "the answer is X", then the last
    number."""
    stripped = text.strip()
    if _INT.match(stripped):  # fast path: the completion is a bare integer
        return stripped
    boxed = _last_boxed(text)
    if boxed:
        return boxed
    said = list(_ANSWER_IS.finditer(text))
    if said:
        rest = text[said[-1].end() :].split("\n", 1)[0]
        rest = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0].strip().strip("$").strip()
        lead = _NUMBER.match(rest)
        if lead and re.fullmatch(r"\s+[A-Za-z]{2,}[A-Za-z ]*", rest[lead.end() :]):  # "7 apples"
            return lead.group()
        if rest:
            return rest
    if re.fullmatch(r"\$[^$]+\$", stripped):  # the whole completion is one formula
        return stripped
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize(text: str) -> str:
    """Strip the dress of an answer: $, \\text{units}, "x =", \\left/\\right, degree signs, trailing
    dot."""
    s = text.strip().strip("$").strip()
    s = _TEXT_CMD.sub("", s)
    for old, new in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\%", "%"),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\cdot", "*"),
        ("\\times", "*"),
        ("\\div", "/"),
        ("−", "-"),
    ):
        s = s.replace(old, new)
    s = _LEAD_VAR.sub("", s)
    return s.strip().rstrip(".").strip()


def to_number(text: str) -> Fraction | None:
    """Parse "1,234", "-3.5", "7/8", "12%", "\\frac{7}{8}" exactly; None when it is not a plain
    number."""
    s, percent = _strip_percent(normalize(text))
    value = _rational(s)
    return None if value is None else value * (Fraction(1, 100) if percent else 1)


def _strip_percent(s: str) -> tuple[str, bool]:
    return (s[:-1].strip(), True) if s.endswith("%") else (s, False)


def _rational(s: str) -> Fraction | None:
    m = re.fullmatch(r"(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}", s) or re.fullmatch(
        r"(-?)\\frac(\d)(\d)", s
    )
    if m:
        num, den = _rational(m.group(2)), _rational(m.group(3))
        if num is None or not den:
            return None
        return -num / den if m.group(1) else num / den
    s = s.replace(" ", "")
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    if not re.fullmatch(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+(?:\.\d*)?)?", s):
        return None
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(num) / Fraction(den)
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _number_candidates(text: str) -> list[Fraction] | None:
    """Values an answer may mean: "50%" is both 0.5 and 50 (a question may ask for the percent)."""
    s, percent = _strip_percent(normalize(text))
    value = _rational(s)
    if value is None:
        return None
    return [value / 100, value] if percent else [value]


def _close(a: float, b: float, rel_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=rel_tol * 1e-3)


def answers_match(
    predicted: str, reference: str, rel_tol: float = 1e-6, symbolic: bool = True
) -> bool:
    p, r = predicted.strip(), reference.strip()
    if _INT.match(p) and _INT.match(r):  # hot path
        return int(p) == int(r)
    if normalize(p) == normalize(r):
        return True
    pa, ra = _number_candidates(p), _number_candidates(r)
    if pa is not None and ra is not None:
        return any(
            x == y
            or (x.denominator != 1 or y.denominator != 1)
            and _close(float(x), float(y), rel_tol)
            for x in pa
            for y in ra
        )
    if not symbolic:
        return False
    return _symbolic_equal(normalize(p), normalize(r), rel_tol)


# ------------------------------------------------------------- symbolic comparison (sympy, guarded)


def latex_to_plain(s: str) -> str:
    """\\frac{a}{b} → (a)/(b), \\sqrt{x} → sqrt(x), \\sqrt[n]{x} → (x)^(1/(n)), braces →
    parentheses."""
    for _ in range(
        8
    ):  # innermost groups first; nesting deeper than 8 stays unparsed (and fails the guard)
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\[([^\[\]{}]*)\]\{([^{}]*)\}", r"((\2)^(1/(\1)))", new)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    s = re.sub(r"\\sqrt(\d)", r"sqrt(\1)", s)
    s = (
        s.replace("\\pi", " pi ")
        .replace("\\ln", " ln")
        .replace("\\log", " log")
        .replace("\\exp", " exp")
    )
    for fn in ("sin", "cos", "tan"):
        s = s.replace("\\" + fn, " " + fn)
    return s.replace("{", "(").replace("}", ")").replace("π", " pi ").replace("√", "sqrt")


def _safe_for_sympy(s: str) -> bool:
    """Only arithmetic, single-letter variables and a few functions; nothing sympy's eval could
    abuse."""
    if len(s) > 200 or not _SAFE_CHARS.match(s) or ".." in s or re.search(r"[A-Za-z_)]\s*\.", s):
        return False
    if any(len(n) > 1 and n.lower() not in _FUNCS for n in _IDENT.findall(s)):
        return False
    return not re.search(r"\d{40,}", s) and s.count("^") + s.count("**") <= 4


def _bounded_powers(expr) -> bool:
    """No power towers and no numeric exponent beyond 100: 9^9^9 would never finish evaluating."""
    import sympy

    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow):
            base, exp = node.args
            if exp.has(sympy.Pow) or (base.has(sympy.Pow) and not base.free_symbols):
                return False
            if exp.is_Number and abs(exp) > 100:
                return False
    return True


def _sympy_namespace(plain: str) -> tuple[dict, dict]:
    """The only names an answer may use in sympy: its one-letter symbols and a few functions."""
    import sympy

    names = {n: sympy.Symbol(n) for n in set(_IDENT.findall(plain)) if len(n) == 1}
    names.update(
        {
            "sqrt": sympy.sqrt,
            "log": sympy.log,
            "ln": sympy.log,
            "exp": sympy.exp,
            "sin": sympy.sin,
            "cos": sympy.cos,
            "tan": sympy.tan,
            "pi": sympy.pi,
            "abs": sympy.Abs,
            "e": sympy.E,
        }
    )
    glob = {
        "__builtins__": {},
        "Integer": sympy.Integer,
        "Float": sympy.Float,
        "Rational": sympy.Rational,
        "Symbol": sympy.Symbol,
        "Add": sympy.Add,
        "Mul": sympy.Mul,
        "Pow": sympy.Pow,
    }
    return names, glob


@lru_cache(maxsize=4096)
def _parse(s: str):
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    plain = latex_to_plain(s)
    if not _safe_for_sympy(plain):
        return None
    names, glob = _sympy_namespace(plain)
    transformations = standard_transformations + (implicit_multiplication_application, convert_xor)
    if "," in plain and plain[:1] in "([" and plain[-1:] in ")]":  # a tuple: (1, 2)
        plain = plain[1:-1]
    exprs = []
    try:
        for part in plain.split(","):
            # Check the unevaluated tree first: evaluation itself is what could run away.
            raw = parse_expr(
                part,
                local_dict=dict(names),
                global_dict=glob,
                evaluate=False,
                transformations=transformations,
            )
            if not _bounded_powers(raw):
                return None
            exprs.append(
                parse_expr(
                    part,
                    local_dict=dict(names),
                    global_dict=glob,
                    evaluate=True,
                    transformations=transformations,
                )
            )
    except Exception:  # noqa: BLE001 - unparsable answers simply do not match
        return None
    return tuple(exprs)


def _symbolic_equal(a: str, b: str, rel_tol: float) -> bool:
    ea, eb = _parse(a), _parse(b)
    if not ea or not eb or len(ea) != len(eb):
        return False
    return all(_expr_equal(x, y, rel_tol) for x, y in zip(ea, eb))


def _expr_equal(x, y, rel_tol: float) -> bool:
    try:
        symbols = sorted((x.free_symbols | y.free_symbols), key=str)
        rng = random.Random(0)
        points = (
            [{}] if not symbols else [{s: rng.uniform(0.5, 2.5) for s in symbols} for _ in range(5)]
        )
        for point in points:
            vx, vy = complex(x.evalf(subs=point)), complex(y.evalf(subs=point))
            if not (
                _close(vx.real, vy.real, max(rel_tol, 1e-9))
                and _close(vx.imag, vy.imag, max(rel_tol, 1e-9))
            ):
                return False
        return True
    except Exception:  # noqa: BLE001 - e.g. non-numeric objects
        return False


class MathAnswer:
    name = "math_answer"
    description = BUILTIN_FUNCTIONS["math_answer"].description

    def __init__(self, name: str = "math_answer", rel_tol: float = 1e-6, symbolic: bool = True):
        self.name, self.rel_tol, self.symbolic = name, rel_tol, symbolic

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        out = []
        for item in items:
            answer = extract_answer(item.completion)
            if answer is None:
                out.append(Score(0.0, detail="no answer found", components={"has_answer": 0.0}))
                continue
            ok = answers_match(answer, item.reference, self.rel_tol, self.symbolic)
            out.append(
                Score(1.0 if ok else 0.0, components={"has_answer": 1.0, "correct": float(ok)})
            )
        return out


class ExactMatch:
    name = "exact_match"
    description = BUILTIN_FUNCTIONS["exact_match"].description

    def __init__(self, name: str = "exact_match", strip: bool = True):
        self.name, self.strip = name, strip

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        if self.strip:
            return [Score(float(i.completion.strip() == i.reference.strip())) for i in items]
        return [Score(float(i.completion == i.reference)) for i in items]


class FormatReward:
    name = "format"
    description = BUILTIN_FUNCTIONS["format"].description

    _PATTERN = re.compile(r"^\s*(\\boxed\{[-+]?\d[\d,./]*\}|[-+]?\d[\d,./]*)\s*$")

    def __init__(self, name: str = "format", pattern: str = ""):
        self.name = name
        if pattern:
            self._PATTERN = re.compile(pattern)

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        return [Score(1.0 if self._PATTERN.match(i.completion) else 0.0) for i in items]
