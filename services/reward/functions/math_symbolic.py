"""The comparison that needs math-verify: it runs in a worker process (``math_workers``), never in
the service, because math-verify and sympy can take unbounded time on a hostile answer.
math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are off here and the
worker pool enforces the limit instead.

brorl's rules around math-verify's ``parse``/``verify`` (docs/rewards.md, "What is equal"): only the
extracted answer is parsed, with no string fallback; units are stripped only from the end of an
answer; a list of plain numbers is ordered; two formulas that evaluate far apart are different
without ``simplify``.
"""

from __future__ import annotations

import logging
import math
import re
from functools import lru_cache

from services.reward.functions import math_equal as me
from services.reward.functions.math_equal import BAD_REFERENCE, DIFFERENT, EQUAL, UNPARSED, Options

_DOLLAR = re.compile(r"(?<!\\)\$")  # a math delimiter; an escaped \$ is a currency sign
_PERCENT = re.compile(
    r"(\d(?:[\d.,]*\d)?|\})\s*(?:\\%|%|\s*\bpercent(?:age)?\b|\s*\bpct\b)", re.IGNORECASE
)
_LIST_ELEMENT = re.compile(
    r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)|[-+]?\\[dt]?frac\{[-+]?\d+\}\{\d+\}|[-+]?\d+/\d+"
)


def verdict(pred: list, gold: list, opts: Options) -> str:
    """EQUAL / DIFFERENT / UNPARSED / BAD_REFERENCE by math-verify (call it in a worker).
    ``pred`` and ``gold`` are [text, math, ordered] of an extracted ``Answer``."""
    (p_text, p_math, p_ordered), (g_text, g_math, g_ordered) = pred, gold
    g = parse_answer(g_text, g_math, opts)
    if not g:
        return BAD_REFERENCE
    p = parse_answer(p_text, p_math, opts)
    if not p:
        return UNPARSED
    if len(g) == 1 and len(p) == 1 and surely_different(g[0], p[0], opts):
        return DIFFERENT
    ordered = _ordered_lists(p_text, g_text) if p_ordered and g_ordered else None
    if ordered is not None:
        same = len(ordered[0]) == len(ordered[1]) and all(
            _equal(parse_answer(b, True, opts), parse_answer(a, True, opts), opts)
            for a, b in zip(*ordered)
        )
        return EQUAL if same else DIFFERENT
    return EQUAL if _equal(g, p, opts) else DIFFERENT


def surely_different(gold, pred, opts: Options) -> bool:
    """True only when two formulas certainly differ: evaluated at the same points they are further
    apart than any rounding allows, in every reading (a percent is both its value and its number,
    as math-verify reads it). It never says "equal"; it spares sympy's ``simplify`` (tens of
    milliseconds) on the common case, a wrong answer. Left to math-verify: anything but plain
    expressions (sets, relations, matrices), bare symbols (its name rules: ``e`` is Euler's
    number), different variables, and non-strict mode (it renames variables)."""
    import sympy

    if not (isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr)):
        return False
    if _symbol_like(gold) or _symbol_like(pred):
        return False
    g_syms, p_syms = gold.free_symbols, pred.free_symbols
    if g_syms and (g_syms != p_syms or not opts.strict):
        return False
    return all(
        _apart(a, b, sorted(p_syms, key=str), opts)
        for a in _readings(gold)
        for b in _readings(pred)
    )


def _readings(x) -> list:
    """A percent's two readings (its value and its bare number); anything else is itself."""
    import sympy

    pct = sympy.UnevaluatedExpr(sympy.Rational(1, 100))
    return [x.subs(pct, sympy.Rational(1, 100)), x.subs(pct, 1)] if x.has(pct) else [x]


def _apart(a, b, symbols: list, opts: Options) -> bool:
    tol = 2 * 10.0**-opts.float_rounding  # two values this far apart never round alike
    for k in (0, 1):
        point = {sym: 0.5 + 0.618034 * (i + 1) + 0.271828 * k for i, sym in enumerate(symbols)}
        try:
            va = complex(a.evalf(15, subs=point))
            vb = complex(b.evalf(15, subs=point))
        except (TypeError, ValueError, ArithmeticError, AttributeError):
            return False
        if not all(map(math.isfinite, (va.real, va.imag, vb.real, vb.imag))):
            return False
        if abs(va - vb) > tol * max(1.0, abs(va), abs(vb)):
            return True
        if not symbols:
            return False
    return False


def _symbol_like(x) -> bool:
    import sympy

    return isinstance(x, sympy.Symbol) or (
        isinstance(x, sympy.Mul)
        and all(isinstance(a, sympy.Symbol) or a == sympy.E for a in x.args)
    )


def _equal(gold_parsed, pred_parsed, opts: Options) -> bool:
    from math_verify import verify

    if not gold_parsed or not pred_parsed:
        return False
    return verify(
        list(gold_parsed),  # a list: verify takes a tuple for one expression
        list(pred_parsed),
        float_rounding=opts.float_rounding,
        strict=opts.strict,
        timeout_seconds=None,
    )


@lru_cache(maxsize=1024)
def parse_answer(text: str, math_mode: bool, opts: Options) -> tuple:
    """math-verify's reading of one extracted answer (empty: it does not parse). A plain number
    outside math mode ("1 000", "1000,99") is read as a number, anything else as LaTeX."""
    from math_verify import ExprExtractionConfig, parse

    s = " ".join(text.split())
    if opts.percent == "value":
        s = _PERCENT.sub(r"\1/100", s)
    if opts.units == "strip" and not math_mode:
        unit = me.NUMBER_WITH_UNIT.fullmatch(s)
        s = unit.group(1).strip() if unit else s
    if not math_mode and me.PLAIN_NUMBER.fullmatch(s):
        found = parse(
            s, [ExprExtractionConfig()], fallback_mode="no_fallback", parsing_timeout=None
        )
        if found:
            return tuple(found)
    found = parse(
        "$" + _DOLLAR.sub("", s) + "$",
        [_latex_config(opts.units == "strip" and _ends_in_unit(s))],
        fallback_mode="no_fallback",
        parsing_timeout=None,
    )
    if not found and re.fullmatch(r"[\d\s.+\-*/^()×÷]+", s):
        found = parse(
            s, [ExprExtractionConfig()], fallback_mode="no_fallback", parsing_timeout=None
        )
    return tuple(found)


def _ends_in_unit(s: str) -> bool:
    """Whether math-verify's unit stripping may run: it removes a trailing ``\\text{}`` even when
    that closes a fraction (``\\frac{1}{\\mathrm{e}}`` would lose its denominator), so only an
    answer that ends in a unit at the top level (or in letters) gets it."""
    return bool(me.TRAILING_UNIT.search(s) or re.search(r"[\d}]\s+[A-Za-z]+\s*$", s))


@lru_cache(maxsize=2)
def _latex_config(units: bool):
    from math_verify import LatexExtractionConfig
    from math_verify.parser import NormalizationConfig

    return LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            basic_latex=True,
            units=units,
            malformed_operators=True,
            nits=True,
            boxed="all",
            equations=False,
        )
    )


def _ordered_lists(pred: str, gold: str) -> tuple[list[str], list[str]] | None:
    """Both answers as lists of plain numbers (two or more each), or None."""
    lists = (_number_list(pred), _number_list(gold))
    return lists if lists[0] and lists[1] else None


def _number_list(s: str) -> list[str] | None:
    parts = me.top_level_split(s)
    if len(parts) < 2:
        return None
    cleaned = [me.SPACING.sub("", p).replace("\\text{and}", "").strip() for p in parts]
    cleaned = [re.sub(r"^(?:and|or)\s+", "", p) for p in cleaned]
    return cleaned if all(_LIST_ELEMENT.fullmatch(p) for p in cleaned) else None


# (answer, reference) pairs of the common shapes, compared once by a new worker before it says it
# is ready: the parser builds its tables for a shape on first use and sympy loads simplify() and
# solve() on first call (together seconds on a loaded machine; a tuple's first parse alone took
# 2.3 s here), which must not count against a real item's time limit.
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"),
    ("50\\%", "\\frac{1}{2}"),
    ("\\sqrt{2}+\\pi", "3"),
    ("x^{2}+2x+1", "(x+1)^2"),
    ("(1, 2)", "(1,2)"),
    ("[0, 1)", "[0,1)"),
    ("\\{1, 2\\}", "1, 2"),
    ("y = 2x + 1", "2x - y + 1 = 0"),
    ("x \\geq 5", "5 \\leq x"),
    ("\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}"),
)


def worker_verdict(job: list | None) -> str | None:
    """What a worker process runs (``math_workers``): ``verdict`` of a job as JSON data, [pred,
    gold, options as a dict]; ``None`` loads math-verify and warms it up."""
    if job is None:
        logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" notes
        for answer, reference in _WARM_UP:
            verdict([answer, True, True], [reference, True, True], Options())
        return None
    pred, gold, opts = job
    return verdict(pred, gold, Options(**opts))


WORKER = f"{__name__}:worker_verdict"  # the target math_workers runs
