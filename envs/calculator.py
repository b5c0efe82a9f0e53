"""A tool-use environment: arithmetic with a calculator the policy calls.

A prompt is a problem such as ``37*48=`` with its reference ``1776``. A policy turn that ends
in a tool call ``[expression]`` (the run's stop string ``]`` ends the turn there) is answered
with the expression's value and a bar, ``1776|``, which the policy reads before its next turn;
any other turn is the final answer: reward 1 if it equals the reference (surrounding spaces
ignored), else 0, and the episode ends. So a solved episode reads

    37*48=[37*48]1776|1776<eos>       (policy: [37*48] and 1776; environment: 1776|)

Expressions are non-negative integers joined by + - * (no parentheses, standard precedence),
evaluated without ``eval``; anything else, or a longer one than ``max_expression_chars``, is
answered ``?|``. With ``tool: false`` every call is answered ``?|``: the same task without the
tool, for comparison."""

from __future__ import annotations

import re
from dataclasses import dataclass

from envs.base import Turn
from envs.config import CalculatorConfig

CALL = re.compile(r"\[([^\[\]]*)\]\s*$")
TERM = re.compile(r"\s*(\d{1,12})\s*")
UNKNOWN = "?|"


@dataclass
class _State:
    reference: str
    calls: int = 0


class Calculator:
    name = "calculator"
    version = "1"
    max_turns = 4
    description = "arithmetic with a calculator tool: [a*b] is answered with its value"

    def __init__(self, cfg: CalculatorConfig | None = None):
        self.cfg = cfg or CalculatorConfig()

    def reset(self, prompt: str, reference: str, extra: dict, seed: int):
        return _State(reference.strip()), ""

    def step(self, state: _State, turn: int, action: str, policy_done: bool) -> Turn:
        call = CALL.search(action)
        if call and not policy_done:
            state.calls += 1
            value = None
            if self.cfg.tool:
                value = evaluate(call.group(1), self.cfg.max_expression_chars)
            observation = UNKNOWN if value is None else f"{value}|"
            return Turn(observation=observation, info={"calls": str(state.calls)})
        right = action.strip() == state.reference
        return Turn(reward=float(right), done=True, info={"calls": str(state.calls)})


def evaluate(expression: str, max_chars: int = 64) -> int | None:
    """The value of non-negative integers joined by + - * (``*`` first), or None."""
    if not expression or len(expression) > max_chars:
        return None
    parts = re.split(r"([+\-*])", expression)
    terms = parts[0::2]
    ops = parts[1::2]
    values = []
    for t in terms:
        m = TERM.fullmatch(t)
        if not m:
            return None
        values.append(int(m.group(1)))
    # products first, then sums and differences, left to right
    sums, signs = [values[0]], []
    for op, v in zip(ops, values[1:]):
        if op == "*":
            sums[-1] *= v
        else:
            sums.append(v)
            signs.append(op)
    total = sums[0]
    for op, v in zip(signs, sums[1:]):
        total = total + v if op == "+" else total - v
    return total
