"""The comparison rules (services/reward/functions/math_equal.py in the service, math_symbolic.py in
the workers): text answers, and the shortcuts that spare math-verify (integers, exact fractions,
shape mismatches, the numeric pre-check), each checked against math-verify's own verdict on the
same pairs."""

from __future__ import annotations

import itertools
import time

import pytest

from services.reward.functions import math_equal as me
from services.reward.functions import math_symbolic as ms

OPTS = me.Options()


@pytest.mark.parametrize(
    "a,b,equal",
    [
        ("\\text{(A)}", "\\text{(B)}", False),  # unwrapped, never deleted
        ("\\text{(A)}", "(A)", True),
        ("\\text{(A)}", "A", True),
        ("\\textbf{Devon}", "devon", True),
        ("\\text{odd}", "\\text{oddd}", False),
        ("\\text{ The  Midpoints }", "the midpoints.", True),
    ],
)
def test_text_answers_compare_as_text(a, b, equal):
    verdict = me.quick_verdict(a, b, OPTS)
    assert verdict == (me.EQUAL if equal else me.DIFFERENT)


@pytest.mark.parametrize("a,b", [("\\text{}", "\\text{}"), ("\\text{}", "\\text{ }"), ("}{", "}{")])
def test_empty_or_unparseable_answers_equal_nothing_not_even_themselves(a, b):
    assert me.quick_verdict(a, b, OPTS) != me.EQUAL
    assert ms.verdict([a, True, True], [b, True, True], OPTS) != me.EQUAL


@pytest.mark.parametrize(
    "s,text",
    [
        ("\\text{odd}", True),
        ("\\text{(A)}", True),
        ("yes", True),
        ("The midpoints form a regular hexagon", True),
        ("10\\text{ units}", False),  # a unit, stripped by default
        ("\\frac{1}{3} \\textbf{meters}", False),
        ("7 apples", False),
        ("\\begin{pmatrix}1 & 0\\\\0 & 1\\end{pmatrix}", False),
        ("S_{MBCN}:S=7:32", False),  # names of points are not prose
        ("\\frac{NO}{BO}=\\frac{1}{\\sqrt{6}}", False),
        ("\\sqrt{2}+\\infty", False),
        ("x \\in [-2,7]", False),
        ("2xy", False),
    ],
)
def test_what_is_a_text_answer(s, text):
    assert me.is_text_answer(s) is text


def test_units_kept_make_a_unit_part_of_the_answer():
    assert me.is_text_answer("7 apples", units="keep")
    assert me.quick_verdict("7 apples", "7", me.Options(units="keep")) == me.DIFFERENT


def test_integers_of_any_length_and_signs():
    assert me.quick_verdict("-0", "0", OPTS) == me.EQUAL
    assert me.quick_verdict("+007", "7", OPTS) == me.EQUAL
    assert me.quick_verdict("9" * 6000, "9" * 6000, OPTS) == me.EQUAL
    assert me.quick_verdict("-" + "9" * 6000, "9" * 6000, OPTS) == me.DIFFERENT
    assert me.quick_verdict("", "1", OPTS) == me.UNPARSED
    assert me.quick_verdict("1", " ", OPTS) == me.BAD_REFERENCE


NUMBERS = [
    "3",
    "-3",
    "03",
    "1,000",
    "1000",
    "14{,}916",
    "14916",
    "\\frac{3}{4}",
    "\\dfrac34",
    "\\tfrac{6}{8}",
    "-\\frac{1}{2}",
    "3/4",
    "6/8",
    "\\$5",
    "5",
    "0.75",
    "32, 349",
]
SHAPES = ["(1, 2)", "[3, 4]", "(0.75, 1)", "\\begin{pmatrix}1 & 2\\end{pmatrix}", "[3, 3]", "(3)"]
# Formulas with a variable, never a number (the degenerate \frac{3x}{4x} = 3/4 is tested below).
VARIABLES = ["x^{2}+7x", "\\frac{\\sqrt{y}}{2}", "3x", "a_1", "x + 1 - 1", "x = 3/4", "2e", "5 m"]
VARIABLES += ["x\\approx 3", "x\\approx3", "y \\le 4", "x\\in\\{3\\}"]


def math_verify_verdict(pred: str, gold: str) -> str:
    """math-verify alone on the two answers (no brorl shortcut)."""
    g, p = ms.parse_answer(gold, True, OPTS), ms.parse_answer(pred, True, OPTS)
    if not g:
        return me.BAD_REFERENCE
    if not p:
        return me.UNPARSED
    return me.EQUAL if ms._equal(g, p, OPTS) else me.DIFFERENT


def test_in_process_shortcuts_agree_with_math_verify():
    disagree = []
    for pred, gold in itertools.product(NUMBERS + SHAPES + VARIABLES, NUMBERS):
        quick = me.quick_verdict(pred, gold, OPTS)
        if quick is not None and quick != math_verify_verdict(pred, gold):
            disagree.append((pred, gold, quick))
    assert disagree == []


EXPRESSIONS = [
    "\\frac{3}{4}",
    "0.75",
    "\\frac{\\sqrt{2}}{2}",
    "\\frac{1}{\\sqrt{2}}",
    "\\sqrt{8}",
    "2\\sqrt{2}",
    "\\pi",
    "3.14159",
    "\\sin(\\pi/6)",
    "0.5",
    "x^2+2x+1",
    "(x+1)^2",
    "x^2+2x",
    "\\frac{x+2}{7}",
    "\\frac{x}{7}+\\frac{2}{7}",
    "e^{2}",
    "\\ln(e)",
    "1",
    "i^2",
    "-1",
    "\\tan^2(y)+1",
    "\\sec^2(y)",
    "0.333333",
    "\\frac{1}{3}",
    "75\\%",
    "0.75",
    "75",
    "7500\\%",
    "12.5\\%",
    "12.5",
    "0.125",
]


def test_surely_different_never_rejects_what_math_verify_accepts_and_spares_most():
    unequal, fired, unsound = 0, 0, []
    for gold, pred in itertools.permutations(EXPRESSIONS, 2):
        g, p = ms.parse_answer(gold, True, OPTS), ms.parse_answer(pred, True, OPTS)
        different = ms.surely_different(g[0], p[0], OPTS)
        if ms._equal(g, p, OPTS):
            if different:
                unsound.append((gold, pred))
        else:
            unequal += 1
            fired += different
    assert unsound == []
    # the rest have different variables (or a bare symbol), which it leaves to math-verify
    assert fired >= 0.6 * unequal


@pytest.mark.parametrize(
    "pred,gold,equal",
    [
        ("10, 4, -2", "4, 10, -2", False),  # a list of numbers is ordered
        ("10, 4, -2", "10, 4, -2", True),
        ("0.1, 4, 2", "4, .1, 2", False),
        ("\\{4, 10\\}", "10, 4", True),  # a set is a set
        ("3, 4", "3", False),  # a hedge
        ("3 or 4", "4", False),
    ],
)
def test_lists_sets_and_hedges(pred, gold, equal):
    got = ms.verdict([pred, True, True], [gold, True, True], OPTS)
    assert got == (me.EQUAL if equal else me.DIFFERENT)


def test_separate_answers_are_a_set_even_in_order_of_a_list():
    assert ms.verdict(["4, 10", True, False], ["10, 4", True, True], OPTS) == me.EQUAL


@pytest.mark.parametrize("answer", ["\\frac{1}{", "\\sqrt{}", "x^{", "\\begin{pmatrix}"])
def test_an_unparseable_answer_is_unparsed_not_a_string_to_compare(answer):
    assert ms.parse_answer(answer, True, OPTS) == ()
    assert ms.verdict([answer, True, True], ["1", True, True], OPTS) == me.UNPARSED


def test_long_references_cost_little_in_the_service():
    long_text = "The answer is the word " + "very " * 1000 + "long"
    hostile = "1" + " " * 200_000 + "!"
    start = time.process_time()  # CPU time: a loaded machine slows the clock, not the work
    assert me.quick_verdict(long_text.upper(), long_text, OPTS) == me.EQUAL
    assert me.quick_verdict("1", hostile, OPTS) == me.DIFFERENT
    assert time.process_time() - start < 1.0


def test_a_variable_never_equals_a_number_even_when_it_cancels():
    # stricter than math-verify, whose simplify() accepts it: a degenerate answer is no answer
    assert math_verify_verdict("\\frac{3x}{4x}", "\\frac{3}{4}") == me.EQUAL
    assert me.quick_verdict("\\frac{3x}{4x}", "\\frac{3}{4}", OPTS) == me.DIFFERENT
    assert me.quick_verdict("x = \\frac{3}{4}", "\\frac{3}{4}", OPTS) is None  # states a value
