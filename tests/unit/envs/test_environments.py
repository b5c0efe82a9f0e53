"""The environments brorl ships (envs/calculator.py, envs/dialogue.py) on their own: the tool
call and its answer, the final answer, the consistency rule of the dialogue."""

from __future__ import annotations

import pytest

from envs.calculator import Calculator, evaluate
from envs.config import CalculatorConfig, DialogueConfig
from envs.dialogue import Dialogue


@pytest.mark.parametrize(
    "expression, value",
    [("37*48", 1776), ("2+3*4-1", 13), (" 3 * 4 ", 12), ("10-20", -10), ("7", 7), ("0*5+2", 2)],
)
def test_the_calculator_evaluates_with_precedence(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression", ["", "1+", "*2", "a", "2**3", "(1+2)", "1/2", "1" * 13, "1+" * 40 + "1"]
)
def test_anything_else_is_no_value(expression):
    assert evaluate(expression) is None


def test_a_tool_call_is_answered_and_the_final_answer_scored():
    env = Calculator()
    state, first = env.reset("37*48=", "1776", {}, 0)
    assert first == ""
    call = env.step(state, 1, "[37*48]", False)
    assert (call.observation, call.reward, call.done) == ("1776|", 0.0, False)
    final = env.step(state, 2, "1776", True)
    assert (final.reward, final.done, final.info) == (1.0, True, {"calls": "1"})
    state, _ = env.reset("37*48=", "1776", {}, 0)
    assert env.step(state, 1, "1766", True).reward == 0.0  # a direct, wrong answer


def test_without_the_tool_every_call_is_unknown():
    env = Calculator(CalculatorConfig(tool=False))
    state, _ = env.reset("37*48=", "1776", {}, 0)
    assert env.step(state, 1, "[37*48]", False).observation == "?|"
    assert env.step(state, 2, "1776", True).reward == 1.0


def test_a_bad_tool_call_is_answered_unknown():
    env = Calculator()
    state, _ = env.reset("3*4=", "12", {}, 0)
    assert env.step(state, 1, "[3*]", False).observation == "?|"


def test_the_dialogue_checks_each_answer_against_the_previous_one():
    env = Dialogue(DialogueConfig(turns=3))
    state, _ = env.reset("5+3=", "8", {}, 0)
    first = env.step(state, 1, "8|", False)
    assert first.reward == pytest.approx(1 / 3) and not first.done
    op, operand = first.observation[0], int(first.observation[1:-1])
    wrong_but_said = 100  # the policy says 100; the next turn is checked against 100, not 8
    second = env.step(state, 2, f"{wrong_but_said}|", False)
    assert second.reward == 0.0  # 100 is not 8 op operand
    expected = {"+": 100 + int(second.observation[1:-1]), "-": 100 - int(second.observation[1:-1]),
                "*": 100 * int(second.observation[1:-1])}[second.observation[0]]  # fmt: skip
    third = env.step(state, 3, f"{expected}|", False)
    assert third.done and third.reward == pytest.approx(1 / 3)
    assert third.info["consistent"] == "101"
    assert op in "+-*" and operand > 0


def test_a_malformed_answer_ends_the_dialogue_and_the_user_is_deterministic():
    env = Dialogue()
    state, _ = env.reset("5+3=", "8", {}, 7)
    assert env.step(state, 1, "eight", False).done
    a = [Dialogue().step(Dialogue().reset("5+3=", "8", {}, 7)[0], 1, "8|", False) for _ in "ab"]
    assert a[0].observation == a[1].observation  # the same follow-up in every process
