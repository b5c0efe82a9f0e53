"""A multi-turn dialogue with a rule-based user simulator that checks consistency.

The prompt asks a first question (``5+3=``). The policy answers and ends its turn with ``|``
(the run's stop string); the user then asks a follow-up about that answer, ``+4=`` or ``*2=``
(apply this to your previous answer), for ``turns`` user turns in all. Each answer is checked
against the policy's OWN previous answer, not against the reference chain: a turn is consistent
when it equals (previous answer op operand). Turn rewards: 1 for a consistent turn (the first
one: 1 when it is right), else 0; the episode's reward is their sum divided by the number of
turns, so 1.0 means the whole dialogue was right and consistent. A malformed answer ends the
dialogue (reward 0 for that turn and every turn left)."""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass, field

from envs.base import Turn
from envs.config import DialogueConfig

ANSWER = re.compile(r"\s*(-?\d{1,12})\s*\|?\s*$")
OPS = ("+", "*", "-")


@dataclass
class _State:
    expected: int  # the right value of the current question, given the previous answer
    rng: random.Random
    turn: int = 0
    consistent: list[bool] = field(default_factory=list)


class Dialogue:
    name = "dialogue"
    version = "1"
    description = "3-turn arithmetic dialogue; every answer checked against the previous one"

    def __init__(self, cfg: DialogueConfig | None = None):
        self.cfg = cfg or DialogueConfig()
        self.max_turns = self.cfg.turns

    def reset(self, prompt: str, reference: str, extra: dict, seed: int):
        rng = random.Random(zlib.crc32(f"{self.cfg.seed}/{seed}/{prompt}".encode()))
        return _State(int(reference.strip()), rng), ""

    def step(self, state: _State, turn: int, action: str, policy_done: bool) -> Turn:
        state.turn = turn
        m = ANSWER.fullmatch(action)
        share = 1.0 / self.cfg.turns
        if not m:
            return Turn(done=True, info={"consistent": _mask(state), "ended": "malformed"})
        answer = int(m.group(1))
        ok = answer == state.expected
        state.consistent.append(ok)
        if turn >= self.cfg.turns or policy_done:
            return Turn(reward=share * ok, done=True, info={"consistent": _mask(state)})
        op = state.rng.choice(OPS)
        operand = state.rng.randint(2, 9) if op == "*" else state.rng.randint(1, 20)
        state.expected = _apply(answer, op, operand)  # consistent with what the policy said
        return Turn(observation=f"{op}{operand}=", reward=share * ok)


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _mask(state: _State) -> str:
    return "".join("1" if c else "0" for c in state.consistent)
