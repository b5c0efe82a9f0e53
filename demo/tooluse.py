"""The tool-use task: multiplication with a calculator the policy calls (envs/calculator.py).

A problem is ``37*48=`` with its answer ``1776``: a 2-digit number times a 1- or 2-digit one.
The tiny model cannot multiply, but it can call the calculator — ``[37*48]``, answered
``1776|`` — and copy the result. The warm-start imitates a demonstrator that uses the tool
imperfectly: it calls it for nearly every problem, but it learned the habit on problems whose
second factor has one digit, so for most problems with a 2-digit factor its call carries only
that factor's first digit (``[37*4]``, answered ``148|``, and it copies the wrong result); now and
then a call has a wrong first operand, or it answers without the tool. The warm-started policy
is then right on most of the easy half and wrong on most of the hard half; RL with the
environment's reward teaches it to copy the whole factor into its call.

Everything after the prompt is a transcript of policy and environment segments; the
supervised loss is on the policy's tokens only, as in RL (docs/environments.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# The characters of the task: the demo's, the tool call's brackets, the result's bar and the
# calculator's "?" (an expression it cannot evaluate).
CHARS = list("0123456789+-*=() []|?")
HELDOUT_SEED = 2_000_003


@dataclass(frozen=True)
class ToolProblem:
    prompt: str
    answer: str
    hard: bool  # the second factor has two digits


def make_problem(rng: random.Random) -> ToolProblem:
    a = rng.randint(10, 99)
    hard = rng.random() < 0.5
    b = rng.randint(10, 99) if hard else rng.randint(2, 9)
    return ToolProblem(f"{a}*{b}=", str(a * b), hard)


SPACE = 90 * (8 + 90)  # distinct prompts: a in 10..99 times b in 2..9 or 10..99


def problems(n: int, seed: int, exclude: set[str] = frozenset()) -> list[ToolProblem]:
    """``n`` distinct problems (prompts in ``exclude`` left out)."""
    if n > SPACE - len(exclude):
        raise ValueError(f"{n} problems asked for; the task has {SPACE - len(exclude)} more")
    rng, out, seen = random.Random(seed), [], set(exclude)
    while len(out) < n:
        p = make_problem(rng)
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return out


def heldout(n: int) -> list[ToolProblem]:
    return problems(n, HELDOUT_SEED)


@dataclass(frozen=True)
class Demonstrator:
    """How the imitated policy behaves (the shares are probabilities per problem)."""

    tool: float = 0.9  # calls the tool (else answers directly: a guess)
    full_call_hard: float = 0.15  # a call on a 2-digit factor carries all of it (else 1 digit)
    typo: float = 0.1  # a call's first operand is off by one digit

    def transcript(self, p: ToolProblem, rng: random.Random) -> list[tuple[str, bool]]:
        """(text, the policy's) segments after the prompt; the closing <eos> is implied."""
        a, b = p.prompt[:-1].split("*")
        if rng.random() >= self.tool:
            return [(guess(p, rng), True)]
        if rng.random() < self.typo:
            a = str(int(a) + rng.choice((-1, 1)) * rng.choice((1, 10)))
        if p.hard and rng.random() >= self.full_call_hard:
            b = b[0]
        result = str(int(a) * int(b))
        return [(f"[{a}*{b}]", True), (f"{result}|", False), (result, True)]


def guess(p: ToolProblem, rng: random.Random) -> str:
    """A direct answer without the tool: the right number of digits, mostly wrong ones."""
    width = len(p.answer)
    return str(rng.randint(10 ** (width - 1), 10**width - 1))


def encode_transcript(tokenizer, prompt: str, segments) -> tuple[list[int], list[int]]:
    """(ids, labels) of a prompt and its segments, each segment tokenized alone (as the rollout
    worker appends observations); labels -100 on the prompt and the environment's tokens."""
    ids = list(tokenizer.encode(prompt))
    labels = [-100] * len(ids)
    for text, policy in segments:
        seg = list(tokenizer.encode(text, add_special_tokens=False))
        ids += seg
        labels += seg if policy else [-100] * len(seg)
    ids.append(tokenizer.eos_token_id)
    labels.append(tokenizer.eos_token_id)
    # labels[t] is what position t predicts: shift left by one
    return ids, labels[1:] + [-100]
