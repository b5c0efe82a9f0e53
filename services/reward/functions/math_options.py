"""``math_answer``'s settings: how the reference is read, what counts as equal, and what one
comparison may cost (docs/rewards.md lists every key). Kept beside the function, imported by
``services/reward/config.py`` into the union of function specs.
"""

from __future__ import annotations

import math
import os
from typing import Literal

from pydantic import Field, model_validator

from brorl.config.base import StrictModel


class MathAnswerSpec(StrictModel):
    """``math_answer``: brorl's extraction policy around math-verify (docs/rewards.md)."""

    type: Literal["math_answer"] = Field(
        "math_answer", description="Reward function family: math_answer."
    )
    reference_kind: Literal["answer", "solution"] = Field(
        "answer",
        description="answer: the reference is the final answer itself ('42', '\\frac{1}{2}'); "
        "solution: a worked solution whose answer is extracted like a completion's "
        "(GSM8K's '#### 42', MATH's \\boxed{} solutions).",
    )
    strict: bool = Field(
        True,
        description="math-verify's strict mode: variable names matter (f(x) is not f(y)) and a "
        "set is not a tuple; false matches variables by position.",
    )
    percent: Literal["either", "value"] = Field(
        "either",
        description="either: '10%' equals 0.1 and 10 (a question may ask for the percent); "
        "value: '10%' is 0.1 only.",
    )
    units: Literal["strip", "keep"] = Field(
        "strip",
        description="strip: a unit after a number is dropped ('10 cm', '7 apples', "
        "'5\\text{ m}' are the number); keep: the unit is part of the answer (compared as "
        "text).",
    )
    float_rounding: int | None = Field(
        None,
        ge=0,
        le=15,
        description="Decimal places a decimal answer is rounded to before comparing "
        "(math-verify's float_rounding: at 6, 0.333333 equals 1/3, 0.3333 does not); "
        "unset: 6, or what rel_tol implies.",
    )
    rel_tol: float | None = Field(
        None,
        gt=0,
        le=0.1,
        description="Older spelling of float_rounding, kept so existing configs load: "
        "float_rounding = round(-log10(rel_tol)) (1e-6 → 6 places). Set one or the other.",
    )
    symbolic: bool = Field(
        True,
        description="Compare formulas with math-verify (in worker processes); false: only "
        "integers, plain numbers (exactly) and text answers.",
    )
    last_number: bool = Field(
        True,
        description="When nothing marks an answer (box, 'the answer is', '####', a final "
        "formula), use the last number of the completion; false: such a completion has no "
        "answer.",
    )
    timeout_s: float = Field(
        2.0,
        ge=0.05,
        le=60,
        description="Wall-time limit per comparison; past it the worker is killed and "
        "replaced and the path gets status timeout.",
    )
    processes: int = Field(
        default_factory=lambda: max(1, min(4, os.cpu_count() or 1)),
        ge=1,
        le=64,
        description="Worker processes for formula comparisons (started on first need).",
    )
    memory_mb: int = Field(
        1024,
        ge=256,
        le=65536,
        description="Address-space limit of each worker process (RLIMIT_AS, MiB).",
    )

    @model_validator(mode="after")
    def _one_tolerance(self):
        if self.rel_tol is not None and self.float_rounding is not None:
            raise ValueError(
                "set float_rounding or rel_tol, not both (rel_tol is the older spelling)"
            )
        return self

    def rounding(self) -> int:
        """The decimal places floats are rounded to, from float_rounding or rel_tol."""
        if self.float_rounding is not None:
            return self.float_rounding
        if self.rel_tol is not None:
            return max(0, min(15, round(-math.log10(self.rel_tol))))
        return 6
