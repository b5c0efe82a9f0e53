"""Rule rewards for math: final-answer extraction and numeric comparison, and a format reward."""
from __future__ import annotations

import re
from fractions import Fraction

from services.reward.base import Score, ScoreItem

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?([-+]?[0-9][0-9,./%]*)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?%?")


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: \\boxed{...}, then "the answer is X", then the last number."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    said = _ANSWER_IS.findall(text)
    if said:
        return said[-1].rstrip(".")
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def to_number(text: str) -> Fraction | None:
    """Parse "1,234", "-3.5", "7/8", "12%" exactly; None when it is not a plain number."""
    s = text.strip().replace(",", "").replace(" ", "").rstrip(".")
    scale = Fraction(1)
    if s.endswith("%"):
        s, scale = s[:-1], Fraction(1, 100)
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(int(num), int(den)) * scale
        return Fraction(s) * scale
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str, reference: str) -> bool:
    a, b = to_number(predicted), to_number(reference)
    if a is not None and b is not None:
        return a == b
    return predicted.strip() == reference.strip()


class MathAnswer:
    name = "math_answer"
    description = "1 if the completion's final answer equals the reference numerically (\\boxed{}, 'the answer is', or last number), else 0."

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        out = []
        for item in items:
            answer = extract_answer(item.completion)
            if answer is None:
                out.append(Score(0.0, detail="no answer found", components={"has_answer": 0.0}))
                continue
            ok = answers_match(answer, item.reference)
            out.append(Score(1.0 if ok else 0.0, components={"has_answer": 1.0, "correct": float(ok)}))
        return out


class FormatReward:
    name = "format"
    description = "1 if the completion is a single bare number (optionally \\boxed{}), else 0; no reference needed."

    _PATTERN = re.compile(r"^\s*(\\boxed\{[-+]?\d[\d,./]*\}|[-+]?\d[\d,./]*)\s*$")

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        return [Score(1.0 if self._PATTERN.match(i.completion) else 0.0) for i in items]
