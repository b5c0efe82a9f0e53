"""The ``countdown`` reward on irregular inputs: the grammar, the numbers used exactly once, exact
division, unary minus, extraction, hostile sizes (each bounded in CPU time, never a recursion
error) and the configuration.

Mutations tried, each failing a test here: the reused-number check removed from
``check_numbers`` (test_a_reused_number_is_refused); the whole-quotient check replaced by floor
division (test_division_must_be_exact); every operator given the same precedence, i.e. left to
right (test_precedence_and_associativity)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from brorl.config.base import validate
from brorl.contract import RewardStatus
from services.reward.base import ScoreItem
from services.reward.config import CountdownSpec, RewardServiceConfig
from services.reward.functions.countdown import (
    Countdown,
    Verdict,
    check,
    extract,
    read_reference,
)
from services.reward.registry import build_registry, default_registry


def score(completion: str, reference: str, spec: CountdownSpec | None = None):
    [s] = Countdown(spec=spec).score_batch([ScoreItem("i", "", completion, reference)])
    return s


def verdict(completion: str, reference: str, **limits) -> str:
    numbers, target = read_reference(reference)
    return check(completion, numbers, target, **limits)[0]


def test_a_correct_expression_scores_1_and_a_wrong_one_0():
    s = score("(50-25)*3+7", "3,7,25,50:82")
    assert (s.reward, s.status, s.detail) == (1.0, RewardStatus.OK, "")
    assert s.components == {"correct": 1.0, "format": 1.0}
    s = score("(50-25)*3+7", "3,7,25,50:78")
    assert (s.reward, s.status) == (0.0, RewardStatus.OK)
    assert s.detail.startswith(Verdict.WRONG_VALUE) and "82" in s.detail
    assert s.components == {"correct": 0.0, "format": 1.0}


@pytest.mark.parametrize(
    "expression, numbers, target",
    [
        ("2+3*4", "2,3,4", 14),
        ("4+2*3", "2,3,4", 10),
        ("2*3+4", "2,3,4", 10),
        ("(2+3)*4", "2,3,4", 20),
        ("8-3-2", "2,3,8", 3),
        ("8-(3-2)", "2,3,8", 7),
        ("8/4/2", "2,4,8", 1),
        ("8/(4/2)", "2,4,8", 4),
        ("9-6/3", "3,6,9", 7),
        ("2*9-6/3*4", "2,3,4,6,9", 10),
    ],
)
def test_precedence_and_associativity(expression, numbers, target):
    ref = f"{numbers}:{target}"
    assert verdict(expression, ref) == Verdict.CORRECT
    assert verdict(expression, f"{numbers}:{target + 1}") == Verdict.WRONG_VALUE


def test_a_reused_number_is_refused():
    # 3*4+5+4 = 21 uses every given number, and 4 twice; 21 is not reachable from 3, 4, 5
    assert score("3*4+5+4", "3,4,5:21").detail.startswith(Verdict.REUSED_NUMBER)
    assert score("3*4+5+4", "3,4,5:21").reward == 0.0
    assert verdict("5+5+3", "5,3,7:13") == Verdict.REUSED_NUMBER  # 7 unused as well
    assert verdict("5+5+3", "5,5,3:13") == Verdict.CORRECT  # given twice: used twice
    assert verdict("5+5+5+3", "5,5,3:18") == Verdict.REUSED_NUMBER


def test_an_unused_or_unknown_number_is_refused():
    assert verdict("3*4", "3,4,5:12") == Verdict.UNUSED_NUMBER
    assert verdict("5+3", "5,5,3:8") == Verdict.UNUSED_NUMBER
    assert verdict("3*4+6", "3,4,5:18") == Verdict.UNKNOWN_NUMBER
    s = score("3*4", "3,4,5:12")
    assert "not used: 5" in s.detail and s.components["format"] == 1.0


def test_division_by_zero_is_a_verdict_not_an_error():
    s = score("7/(4-4)", "4,4,7:7")
    assert (s.reward, s.status) == (0.0, RewardStatus.OK)
    assert s.detail.startswith(Verdict.DIVISION_BY_ZERO)
    assert verdict("(4-4)/7", "4,4,7:0") == Verdict.CORRECT  # 0 divided is fine


def test_division_must_be_exact():
    # 7/2 = 3.5: refused whether the rest would make it whole (14) or a floor would hit (12)
    assert verdict("7/2*4", "2,4,7:14") == Verdict.INEXACT_DIVISION
    assert verdict("7/2*4", "2,4,7:12") == Verdict.INEXACT_DIVISION
    assert verdict("4*7/2", "2,4,7:14") == Verdict.CORRECT  # 28/2 is whole
    assert verdict("(7-2)/4", "2,4,7:1") == Verdict.INEXACT_DIVISION
    assert verdict("(7+1)/4-2", "1,2,4,7:0") == Verdict.CORRECT


@pytest.mark.parametrize("expression", ["-3+4+5", "3*-4+5", "3--4+5", "(-3)+4+5", "5+4+(-3)"])
def test_unary_minus_is_refused(expression):
    assert verdict(expression, "3,4,5:6") == Verdict.UNARY_MINUS


def test_other_operators_and_whitespace_are_read():
    ref = "2,3,4:14"
    for text in ["2 + 3 * 4", " \t2+3\n*4 ", "2+3\u00d74", "2 + 3 \u00d7 4"]:
        assert verdict(text, ref) == Verdict.CORRECT, text
    assert verdict("8\u00f74\u22122", "2,4,8:0") == Verdict.CORRECT  # ÷ and − (U+2212)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", Verdict.NO_EXPRESSION),
        ("   \n", Verdict.NO_EXPRESSION),
        ("abc", Verdict.BAD_CHARACTER),
        ("2+3*4 done", Verdict.BAD_CHARACTER),
        ("2**3+4", Verdict.SYNTAX),
        ("2^3+4", Verdict.BAD_CHARACTER),
        ("2.0+3*4", Verdict.BAD_CHARACTER),
        ("\uff12+3*4", Verdict.BAD_CHARACTER),  # a full-width digit
        ("\u0662+3*4", Verdict.BAD_CHARACTER),  # an Arabic-Indic digit
        ("2\x00+3*4", Verdict.BAD_CHARACTER),
        ("+2+3*4", Verdict.SYNTAX),  # unary plus
        ("2+3*4+", Verdict.SYNTAX),
        ("2 3*4", Verdict.SYNTAX),
        ("2(3)*4", Verdict.SYNTAX),
        ("(2+3)4", Verdict.SYNTAX),
        ("()+2+3*4", Verdict.SYNTAX),
        ("((2+3*4)", Verdict.SYNTAX),
        ("2+3*4)", Verdict.SYNTAX),
        ("02+3*4", Verdict.SYNTAX),  # a leading zero
    ],
)
def test_garbage_is_refused_with_its_reason(text, expected):
    s = score(text, "2,3,4:14")
    assert (s.reward, s.status) == (0.0, RewardStatus.OK)
    assert s.detail.startswith(expected + ":"), s.detail
    assert s.components == {"correct": 0.0, "format": 0.0}


def test_the_expression_is_the_text_after_the_last_equals_sign():
    assert extract("2+3*4") == "2+3*4"
    assert extract("I try: 2,3,4 = 2 + 3*4 ") == "2 + 3*4"
    assert extract("a=b=2+3*4") == "2+3*4"
    assert verdict("2,3,4:14=2+3*4", "2,3,4:14") == Verdict.CORRECT  # prompt + completion
    assert verdict("2+3*4=14", "2,3,4:14") == Verdict.UNKNOWN_NUMBER  # read as "14"
    assert verdict("2+3*4=", "2,3,4:14") == Verdict.NO_EXPRESSION


def cpu(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


HOSTILE = {
    "10,000 characters of sums": ("1+" * 5000, Verdict.TOO_LONG),
    "10,000 digits": ("9" * 10_000, Verdict.TOO_LONG),
    "10,000 letters": ("x" * 10_000, Verdict.TOO_LONG),
    "5000 open parentheses": ("(" * 5000 + "2", Verdict.TOO_LONG),
}


@pytest.mark.parametrize("name", sorted(HOSTILE), ids=lambda n: n.replace(" ", "-"))
def test_hostile_input_under_the_default_limits(name):
    text, expected = HOSTILE[name]
    s, seconds = cpu(lambda: score(text, "2,3,4:14"))
    assert s.detail.startswith(expected) and s.reward == 0.0 and s.status == RewardStatus.OK
    assert seconds < 0.5


def test_hostile_input_when_the_length_limit_lets_it_through():
    wide = dict(max_chars=200_000, max_depth=32)
    cases = {
        "(" * 5000 + "2" + ")" * 5000: Verdict.TOO_DEEP,
        "(" * 100_000: Verdict.TOO_DEEP,
        "1" + "0" * 5000 + "+2+3": Verdict.UNKNOWN_NUMBER,  # 10**5000: never converted
        "2+3*4+" + "9" * 100_000: Verdict.UNKNOWN_NUMBER,
        "+".join(["2"] * 50_000): Verdict.REUSED_NUMBER,
        "2+3*4" + "+(4-4)" * 10_000: Verdict.REUSED_NUMBER,
        "2+" * 50_000: Verdict.SYNTAX,
        "(" * 32 + "2+3*4" + ")" * 32: Verdict.CORRECT,
    }
    for text, expected in cases.items():
        got, seconds = cpu(lambda: verdict(text, "2,3,4:14", **wide))
        assert got == expected, (text[:30], got)
        assert seconds < 3.0, (text[:30], seconds)  # linear; a quadratic scan takes minutes
    assert verdict("(" * 33 + "2+3*4" + ")" * 33, "2,3,4:14", **wide) == Verdict.TOO_DEEP
    # deep nesting is read without recursion, whatever the limit
    deep = "(" * 5000 + "2+3*4" + ")" * 5000
    assert verdict(deep, "2,3,4:14", max_chars=20_000, max_depth=10_000) == Verdict.CORRECT


def test_the_format_component():
    spec = CountdownSpec(format_weight=0.1)
    assert score("2+3*4", "2,3,4:14", spec).reward == 1.0
    assert score("2*3*4", "2,3,4:14", spec).reward == pytest.approx(0.1)
    assert score("2*3*3", "2,3,4:14", spec).reward == pytest.approx(0.1)  # read, wrong numbers
    assert score("2*3*", "2,3,4:14", spec).reward == 0.0
    assert score("2*3*4", "2,3,4:14").reward == 0.0  # weight 0 by default


def test_the_reference():
    assert read_reference("3,7,25,50:78") == ((3, 7, 25, 50), 78)
    assert read_reference(" 3 7, 25 ,50 : 78 = ") == ((3, 7, 25, 50), 78)
    assert read_reference("5,5,3:13=") == ((5, 5, 3), 13)
    for bad in ["", "78", "3,7:", ":78", "3,,7:78", "3,7:-1", "a,b:c", "3,7:7" + " " * 2000]:
        s = score("3+7", bad)
        assert (s.reward, s.status) == (0.0, RewardStatus.ERROR), bad
        assert "numbers:target" in s.detail


def test_identical_paths_are_read_once_but_scored_apart():
    fn = Countdown()
    items = [ScoreItem(str(i), "", "2+3*4", "2,3,4:14") for i in range(3)]
    items.append(ScoreItem("x", "", "2+3*4", "2,3,4:20"))
    a, b, c, d = fn.score_batch(items)
    assert a.reward == b.reward == c.reward == 1.0 and d.reward == 0.0
    a.components["correct"] = 5.0
    assert b.components["correct"] == 1.0


def test_registered_configured_and_validated():
    registry = default_registry()
    try:
        assert "countdown" in registry.names()
        [s] = registry.score("countdown", [ScoreItem("i", "", "7/(4-4)", "4,4,7:7")])
        assert s.status == RewardStatus.OK and s.reward == 0.0 and s.latency_ms > 0
    finally:
        registry.close()
    cfg = validate(
        RewardServiceConfig,
        {"functions": {"cd_fmt": {"type": "countdown", "format_weight": 0.1, "max_chars": 50}}},
    )
    registry = build_registry(cfg)
    try:
        [s] = registry.score("cd_fmt", [ScoreItem("i", "", "2*3*4", "2,3,4:14")])
        assert s.reward == pytest.approx(0.1)
        [s] = registry.score("cd_fmt", [ScoreItem("i", "", "2+3*4" + " " * 50, "2,3,4:14")])
        assert s.detail.startswith(Verdict.TOO_LONG)
    finally:
        registry.close()
    for bad in [{"format_weight": 2}, {"max_depth": 0}, {"eval": True}]:
        with pytest.raises(ValidationError):
            CountdownSpec(**bad)
