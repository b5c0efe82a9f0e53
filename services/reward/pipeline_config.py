"""Settings of the ``pipeline`` reward family (services/reward/functions/pipeline.py): its
safety filter stage (services/reward/functions/safety_filter.py), rules, gates and scorer."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from brorl.config.base import StrictModel


def check_regexes(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    return patterns


class SafetyClassifierSpec(StrictModel):
    path: str = Field(
        ...,
        min_length=1,
        description="Local Hugging Face sequence-classification model directory (model + "
        "tokenizer); nothing is downloaded.",
    )
    unsafe_label: int = Field(1, ge=0, description="Index of the model's 'unsafe' class.")
    threshold: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="A completion whose softmax probability of unsafe_label is at least this "
        "is filtered.",
    )
    max_length: int = Field(256, ge=8, description="Tokens of each completion the model reads.")
    batch_size: int = Field(32, ge=1, le=4096, description="Completions per forward pass.")


class PipelineSpec(StrictModel):
    type: Literal["pipeline"] = Field("pipeline", description="Reward function family: pipeline.")
    scorer: str = Field(
        ..., description="The expensive function run only for paths that pass every check."
    )
    max_chars: int = Field(
        0, ge=0, description="Safety filter: completions are truncated to this length (0: off)."
    )
    sensitive_words: list[str] = Field(
        default_factory=list,
        description="Safety filter: any of these (whole words, case-insensitive) → filtered "
        "(reason word).",
    )
    filter_max_chars: int = Field(
        0,
        ge=0,
        description="Safety filter: a completion longer than this is filtered (reason too_long; "
        "0: off).",
    )
    filter_regex: list[str] = Field(
        default_factory=list,
        description="Safety filter: a completion any of these regexes matches is filtered "
        "(reason regex).",
    )
    classifier: SafetyClassifierSpec | None = Field(
        None,
        description="Safety filter: a local sequence-classification model; a completion it "
        "calls unsafe is filtered (reason classifier).",
    )
    filtered_reward: float = Field(
        0.0, description="Reward of a filtered path (the penalty; it is not scored)."
    )
    min_chars: int = Field(0, ge=0, description="Rule: shorter completions fail (early exit).")
    max_chars_rule: int = Field(0, ge=0, description="Rule: longer completions fail (0: off).")
    require_regex: list[str] = Field(
        default_factory=list, description="Rule: each must match somewhere."
    )
    forbid_regex: list[str] = Field(default_factory=list, description="Rule: none may match.")
    gates: dict[str, float] = Field(
        default_factory=dict,
        description="Cheap registry functions → the minimum reward to continue, run in order.",
    )
    fail_reward: float = Field(0.0, description="Reward of a path that fails a rule or gate.")
    clip: float = Field(3.0, ge=0, description="Final reward is clipped to [-clip, clip] (0: off).")

    _valid = field_validator("require_regex", "forbid_regex", "filter_regex")(
        classmethod(lambda cls, v: check_regexes(v))
    )
