"""Reward service configuration: server settings plus named reward functions (``type`` + params).

Every function is reachable by its name through ScoreBatch. The built-in functions
(``BUILTIN_FUNCTIONS`` below, the one table of them: name → default settings + description) exist
even when not listed; listing one of those names replaces its defaults. See docs/rewards.md for
every key with an example.
"""

from __future__ import annotations

import math
import os
from typing import Annotated, Callable, Literal, NamedTuple, Union

from pydantic import Field, field_validator, model_validator

from brorl.config.base import StrictModel
from brorl.rpc import metrics_bind_field
from brorl.security import InferenceSecurityConfig
from brorl.cluster import DEFAULT, METRICS_PORTS, address
from services.reward.functions.math_options import MathAnswerSpec
from services.reward.pipeline_config import PipelineSpec, check_regexes


class ExactMatchSpec(StrictModel):
    type: Literal["exact_match"] = Field(
        "exact_match", description="Reward function family: exact_match."
    )
    strip: bool = Field(True, description="Ignore leading/trailing whitespace on both sides.")


class FormatSpec(StrictModel):
    type: Literal["format"] = Field("format", description="Reward function family: format.")
    pattern: str = Field(
        "", description="Regex the whole completion must match; empty = a bare number."
    )

    _valid = field_validator("pattern")(classmethod(lambda cls, v: check_regexes([v])[0]))


class CodeSpec(StrictModel):
    type: Literal["code"] = Field("code", description="Reward function family: code.")
    mode: Literal["binary", "partial", "shaped"] = Field(
        "partial",
        description="binary: 1 if all tests pass; partial: fraction passed; shaped: weighted "
        "syntax-valid + ran-without-error + fraction passed.",
    )
    syntax_weight: float = Field(
        0.1, ge=0, description="shaped mode: weight of 'the code compiles'."
    )
    runs_weight: float = Field(
        0.2, ge=0, description="shaped mode: weight of 'the code ran without error'."
    )
    tests_weight: float = Field(
        0.7, ge=0, description="shaped mode: weight of the fraction of tests passed."
    )
    wall_s: float = Field(
        2.0, gt=0, le=600, description="Wall-clock limit per completion (seconds)."
    )
    cpu_s: float = Field(
        2.0, gt=0, le=600, description="CPU-time limit per completion (RLIMIT_CPU, seconds)."
    )
    memory_mb: int = Field(
        256, ge=32, le=65536, description="Address-space limit (RLIMIT_AS, MiB)."
    )
    file_size_mb: int = Field(
        8, ge=1, le=4096, description="Largest file the code may write (RLIMIT_FSIZE, MiB)."
    )
    disk_mb: int = Field(
        64, ge=1, le=65536, description="Size of the sandbox tmpfs shared by running jobs (MiB)."
    )
    nproc: int = Field(
        32, ge=1, le=4096, description="Process limit per job (RLIMIT_NPROC on a per-job uid)."
    )
    nofile: int = Field(64, ge=16, le=4096, description="Open-file limit per job (RLIMIT_NOFILE).")
    concurrency: int = Field(
        default_factory=lambda: min(32, 2 * (os.cpu_count() or 1)),
        ge=1,
        le=256,
        description="Jobs run at once (the bounded pool); the rest wait in a queue.",
    )
    isolation: Literal["auto", "namespaces", "guard"] = Field(
        "auto",
        description="namespaces: own net/mount/pid namespaces, read-only filesystem, per-job uid "
        "(needs root); guard: rlimits + an in-process audit-hook guard; auto: namespaces "
        "when root, else guard.",
    )
    uid_base: int = Field(
        0, ge=0, lt=2**31, description="First uid of the per-job uids (0: a random block)."
    )
    prepend_prompt: bool = Field(
        False, description="Run prompt + code (HumanEval style: the prompt holds the signature)."
    )
    max_code_chars: int = Field(50_000, ge=1, description="Longer code is not run (status error).")
    max_tests: int = Field(
        200, ge=1, description="Largest number of test snippets a reference may hold."
    )

    @model_validator(mode="after")
    def _weights(self):
        if self.mode == "shaped" and self.syntax_weight + self.runs_weight + self.tests_weight <= 0:
            raise ValueError("shaped mode needs syntax_weight + runs_weight + tests_weight > 0")
        return self


class RewardModelSpec(StrictModel):
    type: Literal["reward_model"] = Field(
        "reward_model", description="Reward function family: reward_model."
    )
    path: str = Field(
        ...,
        min_length=1,
        description="Directory written by `python -m services.reward.training.rm_train`.",
    )
    batch_size: int = Field(32, ge=1, le=4096, description="Sequences per forward pass.")
    max_length: int = Field(
        512, ge=8, description="Tokens kept per sequence (longer inputs keep their tail)."
    )
    template: str = Field(
        "{prompt}{completion}", description="How prompt and completion are joined."
    )
    scale: float = Field(1.0, description="reward = scale * (raw score - offset).")
    offset: float = Field(0.0, description="Subtracted from the raw score before scaling.")
    threads: int = Field(
        0, ge=0, le=256, description="torch CPU threads for scoring (0: leave torch's default)."
    )


class RelevanceSpec(StrictModel):
    type: Literal["relevance"] = Field(
        "relevance", description="Reward function family: relevance."
    )
    model_path: str = Field(
        "", description="Local transformers encoder (mean-pooled); empty: char n-gram cosine."
    )
    ngram: int = Field(3, ge=1, le=8, description="Fallback: character n-gram size.")
    max_length: int = Field(256, ge=8, description="Tokens per text for the embedding model.")
    batch_size: int = Field(32, ge=1, description="Texts per forward pass for the embedding model.")


class SafetySpec(StrictModel):
    type: Literal["safety"] = Field("safety", description="Reward function family: safety.")
    sensitive_words: list[str] | None = Field(
        None,
        description="Any of these (whole word, case-insensitive) → "
        "reward 0; None: the built-in list.",
    )
    toxicity_lexicon: dict[str, float] | None = Field(
        None, description="word → weight in (0, 1]; None: built-in."
    )
    toxicity_scale: float = Field(
        1.0, gt=0, description="toxicity = min(1, sum of hit weights / scale)."
    )


class DiversitySpec(StrictModel):
    type: Literal["diversity"] = Field(
        "diversity", description="Reward function family: diversity."
    )
    n: int = Field(2, ge=1, le=8, description="n-gram order.")
    unit: Literal["word", "char"] = Field("word", description="Tokens are words or characters.")


class CountdownSpec(StrictModel):
    type: Literal["countdown"] = Field(
        "countdown", description="Reward function family: countdown."
    )
    format_weight: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Reward of a wrong expression that the grammar reads (whatever its numbers and "
        "value); a correct one gets 1, anything else 0.",
    )
    max_chars: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Longer completions are refused unread (reward 0, detail too_long).",
    )
    max_depth: int = Field(
        32, ge=1, le=10_000, description="Deepest parenthesis nesting read; deeper is too_deep."
    )


class CompositeSpec(StrictModel):
    type: Literal["composite"] = Field(
        "composite", description="Reward function family: composite."
    )
    components: dict[str, float] = Field(
        ..., description="Registry name → weight; total = sum(weight * reward)."
    )

    @field_validator("components")
    @classmethod
    def _check(cls, value: dict[str, float]) -> dict[str, float]:
        check_weights(value)
        return value


class JudgeSpec(StrictModel):
    type: Literal["judge"] = Field("judge", description="Reward function family: judge.")
    base_url: str = Field(
        ...,
        min_length=1,
        description="OpenAI-compatible server root, e.g. http://host:8000 "
        "(the judge posts to {base_url}/v1/chat/completions).",
    )
    model: str = Field("judge", description="Model name sent in the request.")
    api_key_env: str = Field(
        "", description="Environment variable holding the API key (never the key itself)."
    )
    rubric: str = Field(
        "",
        description="Prompt template with {prompt}, {completion}, {reference}, {min}, {max}; "
        "empty: the built-in rubric.",
    )
    score_min: float = Field(0.0, description="Lowest score the rubric allows.")
    score_max: float = Field(
        10.0, description="Highest score the rubric allows; reward = score scaled to [0, 1]."
    )
    timeout_s: float = Field(30.0, gt=0, le=600, description="Per-request timeout.")
    retries: int = Field(
        2, ge=0, le=10, description="Extra attempts after a timeout, connection error, 429 or 5xx."
    )
    backoff_s: float = Field(
        0.5, ge=0, le=60, description="Sleep before retry k is backoff_s * 2**k."
    )
    concurrency: int = Field(8, ge=1, le=256, description="Requests in flight at once.")
    max_tokens: int = Field(256, ge=1, description="max_tokens sent to the judge.")
    temperature: float = Field(0.0, ge=0, le=2, description="temperature sent to the judge.")

    @model_validator(mode="after")
    def _range(self):
        if not self.score_max > self.score_min:
            raise ValueError("score_max must be greater than score_min")
        return self


FunctionSpec = Annotated[
    Union[
        MathAnswerSpec,
        ExactMatchSpec,
        FormatSpec,
        CodeSpec,
        RewardModelSpec,
        RelevanceSpec,
        SafetySpec,
        DiversitySpec,
        CompositeSpec,
        JudgeSpec,
        PipelineSpec,
        CountdownSpec,
    ],
    Field(discriminator="type"),
]


class Builtin(NamedTuple):
    """A reward function every reward service has under its own name unless ``functions`` lists
    that name."""

    spec: Callable[
        [], StrictModel
    ]  # factory of its default settings; the registry builds the function from them
    description: str  # one line: what ListRewardFunctions says (the function's class reads it here)


# The one table of built-in reward functions. build_registry registers every entry;
# ListRewardFunctions shows these descriptions; docs/rewards.md ("Built-in functions") lists the
# same names (tests/unit/services/reward/test_reward_layers.py checks that they agree).
BUILTIN_FUNCTIONS: dict[str, Builtin] = {
    "math_answer": Builtin(
        MathAnswerSpec,
        "1 if the completion's final answer (last \\boxed{}, 'the answer is', '#### x', a "
        "final formula, else the last number) equals the reference's by math-verify "
        "(numbers, LaTeX, sets, intervals, matrices, equations; text answers as text), else 0.",
    ),
    "exact_match": Builtin(
        ExactMatchSpec,
        "1 if the completion is exactly the reference string (surrounding "
        "whitespace ignored), else 0: '098' does not match '98', unlike "
        "math_answer.",
    ),
    "format": Builtin(
        FormatSpec,
        "1 if the completion is a single bare number (optionally \\boxed{}), else 0; "
        "no reference needed.",
    ),
    "code": Builtin(
        CodeSpec,
        "Runs the completion's Python code against the reference's unit tests in a sandbox "
        "(binary / partial / shaped rewards).",
    ),
    "relevance": Builtin(
        RelevanceSpec,
        "Cosine similarity of prompt and completion (local embedding model, else "
        "char n-gram bags).",
    ),
    "safety": Builtin(
        SafetySpec,
        "1 - lexicon toxicity; 0 when a sensitive word or phrase appears (word lists, "
        "not a classifier).",
    ),
    "diversity": Builtin(
        DiversitySpec,
        "Normalised n-gram entropy of the completion (1: no repetition, ~0: "
        "degenerate repetition).",
    ),
    "countdown": Builtin(
        CountdownSpec,
        "1 if the expression after the completion's last '=' (else the whole completion) uses "
        "each number of the reference ('3,7,25,50:78') exactly once with + - * / and "
        "parentheses (exact division, no unary minus) and equals its target, else 0.",
    ),
}
DEFAULT_FUNCTIONS = tuple(BUILTIN_FUNCTIONS)  # the built-in names, in table order


def default_specs() -> dict[str, StrictModel]:
    """What ``functions`` holds when a config sets nothing: the two built-ins that config files
    show.

    Only a default for the field; the registry adds every other entry of ``BUILTIN_FUNCTIONS``
    anyway."""
    return {name: BUILTIN_FUNCTIONS[name].spec() for name in ("math_answer", "format")}


def check_weights(weights: dict[str, float]) -> None:
    """Raise ValueError saying what to fix when composite weights are unusable."""
    if not weights:
        raise ValueError("needs at least one component, e.g. {relevance: 0.5, safety: 0.5}")
    for name, w in weights.items():
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w):
            raise ValueError(f"weight of {name!r} must be a finite number, got {w!r}")
    if all(w == 0 for w in weights.values()):
        raise ValueError("all weights are 0; give at least one component a non-zero weight")


class RewardServiceConfig(StrictModel):
    bind: str = Field(
        address(DEFAULT.reward_port),
        description="host:port to serve on (port 0 picks a free one).",
    )
    max_batch: int = Field(
        4096, ge=1, description="Largest ScoreBatch accepted; more is RESOURCE_EXHAUSTED."
    )
    workers: int = Field(8, ge=1, le=256, description="gRPC handler threads.")
    max_concurrent_rpcs: int = Field(
        64,
        ge=1,
        le=100_000,
        description=(
            "Admission control: RPCs in flight (running or waiting for one of `workers`, health "
            "checks included) before more are answered RESOURCE_EXHAUSTED at once "
            "(docs/reliability.md)."
        ),
    )
    port_file: str = Field("", description="If set, the bound port is written here once serving.")
    metrics_bind: str = metrics_bind_field(METRICS_PORTS["reward"])
    security: InferenceSecurityConfig = Field(
        default_factory=InferenceSecurityConfig,
        description="Token and TLS of this server (docs/security.md).",
    )
    clip: float = Field(3.0, ge=0, description="Every reward is clipped to [-clip, clip] (0: off).")
    functions: dict[str, FunctionSpec] = Field(
        default_factory=default_specs,
        description="Reward functions by name (type + params); every "
        "name in BUILTIN_FUNCTIONS exists even when not "
        "listed, and listing it replaces its defaults.",
    )

    @field_validator("functions")
    @classmethod
    def _names(cls, value: dict) -> dict:
        for name in value:
            if not name or ":" in name or name != name.strip():
                raise ValueError(
                    f"function name {name!r} must be non-empty, without ':' or outer spaces"
                )
        return value
