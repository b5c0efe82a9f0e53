"""Rule rewards for math: ``math_answer`` (final answer against the reference), ``exact_match`` and
``format``.

``math_answer`` is brorl's policy around math-verify: which part of a completion is its answer
(``math_extract``), what counts as equal (``math_equal`` in this process, ``math_symbolic`` in the
workers), and where the cost of a comparison is bounded (``math_workers``). Per batch, each
distinct reference is read once and each distinct (answer, reference) pair is compared once, so
identical completions in a group cost one comparison. Integer answers are settled in this process
without importing sympy.
"""

from __future__ import annotations

import re
import threading
from dataclasses import asdict

from pydantic import ValidationError

from brorl.contract import RewardStatus
from brorl.errors import InvalidArgument
from services.reward.base import Score, ScoreItem
from services.reward.config import BUILTIN_FUNCTIONS, MathAnswerSpec
from services.reward.functions import math_equal, math_symbolic
from services.reward.functions.math_extract import (
    Answer,
    extract_answer,
    looks_like_solution,
    read_reference,
)

_DETAILS = {
    math_equal.UNPARSED: "the answer could not be read as mathematics",
    math_equal.BAD_REFERENCE: "the reference has no readable answer",
}


class MathAnswer:
    name = "math_answer"
    description = BUILTIN_FUNCTIONS["math_answer"].description

    def __init__(
        self,
        name: str = "math_answer",
        spec: MathAnswerSpec | None = None,
        shared: MathAnswer | None = None,
    ):
        self.name = name
        self._shared = shared  # a function whose worker processes this one uses
        self.spec = spec if spec is not None else MathAnswerSpec()
        self.options = math_equal.Options(
            float_rounding=self.spec.rounding(),
            strict=self.spec.strict,
            percent=self.spec.percent,
            units=self.spec.units,
            symbolic=self.spec.symbolic,
        )
        self._options_data = asdict(self.options)
        self._pool = None
        self._pool_lock = threading.Lock()

    def with_options(self, name: str, options: str) -> MathAnswer:
        """This function with a run's own comparison options, ``name`` being
        ``<this name>:key=value,...`` (``math_answer:reference_kind=solution``); it shares this
        function's worker processes. InvalidArgument (field ``reward_fn``) saying what to fix."""
        values = parse_inline_options(options, self.name)
        base = self.spec.model_dump()
        if "float_rounding" in values or "rel_tol" in values:  # the run's tolerance replaces ours
            base.update(float_rounding=None, rel_tol=None)
        try:
            spec = MathAnswerSpec.model_validate({**base, **values})
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "options"
            raise InvalidArgument("reward_fn", f"{name}: {where}: {err['msg']}") from None
        return MathAnswer(name, spec, shared=self)

    def _workers(self):
        if self._shared is not None:
            return self._shared._workers()
        with self._pool_lock:
            if self._pool is None:
                from services.reward.functions.math_workers import WorkerPool

                self._pool = WorkerPool(
                    math_symbolic.WORKER,
                    self.spec.processes,
                    self.spec.timeout_s,
                    self.spec.memory_mb,
                )
            return self._pool

    def close(self) -> None:
        if self._shared is not None:
            return  # the workers belong to the function they were derived from
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        refs: dict[str, Answer | None] = {}
        answers: dict[str, Answer | None] = {}
        verdicts: dict[tuple, tuple[str, str]] = {}  # (pred, gold) → (status, verdict | detail)
        pending: dict[tuple, tuple] = {}
        keys: list = []
        for item in items:
            fast = _integer_verdict(item.completion, item.reference)
            if fast is not None:  # the RL hot path: a bare integer against an integer
                keys.append(fast)
                continue
            if item.reference not in refs:
                refs[item.reference] = self._reference(item.reference)
            if item.completion not in answers:
                answers[item.completion] = extract_answer(item.completion, self.spec.last_number)
            gold, pred = refs[item.reference], answers[item.completion]
            key = (pred, gold)
            keys.append(key)
            if key in verdicts or key in pending or gold is None or not gold.text or pred is None:
                continue  # decided already, or _score says why there is nothing to compare
            quick = math_equal.quick_verdict(pred.text, gold.text, self.options)
            if quick is not None:
                verdicts[key] = (RewardStatus.OK, quick)
            else:
                pending[key] = [
                    [pred.text, pred.math, pred.ordered],
                    [gold.text, gold.math, gold.ordered],
                    self._options_data,
                ]
        if pending:
            outcomes = self._workers().run(list(pending.values()))
            for key, outcome in zip(pending, outcomes):
                if outcome.ok:
                    verdicts[key] = (RewardStatus.OK, outcome.value)
                elif outcome.timed_out:
                    verdicts[key] = (RewardStatus.TIMEOUT, outcome.detail)
                else:
                    verdicts[key] = (RewardStatus.ERROR, outcome.detail)
        return [
            _INTEGER_SCORES[k]() if k in _INTEGER_SCORES else self._score(k, verdicts.get(k))
            for k in keys
        ]

    def _reference(self, reference: str) -> Answer | None:
        kind = self.spec.reference_kind
        if kind == "answer" and looks_like_solution(reference):
            return _SOLUTION_REFERENCE
        return read_reference(reference, kind, self.spec.last_number)

    def _score(self, key: tuple, verdict: tuple[str, str] | None) -> Score:
        pred, gold = key
        if gold is None or gold is _SOLUTION_REFERENCE:
            detail = _reference_detail(self.spec.reference_kind if gold is None else "looks")
            return Score(0.0, RewardStatus.ERROR, detail)
        if pred is None:
            return Score(0.0, detail="no answer found", components={"has_answer": 0.0})
        status, value = verdict
        if status != RewardStatus.OK:
            return Score(0.0, status, f"{self.name}: {value}", {"has_answer": 1.0})
        if value == math_equal.BAD_REFERENCE:
            return Score(0.0, RewardStatus.ERROR, _DETAILS[value], {"has_answer": 1.0})
        ok = value == math_equal.EQUAL
        return Score(
            1.0 if ok else 0.0,
            detail=_DETAILS.get(value, ""),
            components={"has_answer": 1.0, "correct": float(ok)},
        )


_INT = re.compile(r"\s*[-+]?\d+\s*")
_INTEGER_SCORES = {
    math_equal.EQUAL: lambda: Score(1.0, components={"has_answer": 1.0, "correct": 1.0}),
    math_equal.DIFFERENT: lambda: Score(0.0, components={"has_answer": 1.0, "correct": 0.0}),
}


def _integer_verdict(completion: str, reference: str) -> str | None:
    """EQUAL / DIFFERENT when both are bare integers (no extraction needed), else None."""
    if _INT.fullmatch(completion) and _INT.fullmatch(reference):
        same = math_equal.int_key(completion.strip()) == math_equal.int_key(reference.strip())
        return math_equal.EQUAL if same else math_equal.DIFFERENT
    return None


# What a run may set in its reward_fn name; time limits and processes are the service's.
INLINE_OPTIONS = (
    "reference_kind",
    "strict",
    "percent",
    "units",
    "float_rounding",
    "rel_tol",
    "symbolic",
    "last_number",
)


def parse_inline_options(body: str, base: str) -> dict[str, str]:
    """``reference_kind=solution,units=keep`` → {"reference_kind": "solution", "units": "keep"};
    InvalidArgument saying what to fix."""
    example = f"write {base}:reference_kind=solution,units=keep"
    values: dict[str, str] = {}
    for part in body.split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not key or not value:
            raise InvalidArgument(
                "reward_fn", f"{base} option {part.strip()!r} is not key=value; {example}"
            )
        if key not in INLINE_OPTIONS:
            raise InvalidArgument(
                "reward_fn",
                f"{base} option {key!r} cannot be set in reward_fn; one of "
                f"{', '.join(INLINE_OPTIONS)} (timeout_s, processes and memory_mb belong to the "
                "reward service's config)",
            )
        if key in values:
            raise InvalidArgument("reward_fn", f"{base} option {key!r} is given twice")
        values[key] = value
    return values


# What _reference returns for a worked solution read as an answer (scored as an error).
_SOLUTION_REFERENCE = Answer("", "reference")


def _reference_detail(kind: str) -> str:
    if kind == "solution":
        return "the reference solution has no answer (reference_kind: solution)"
    if kind == "looks":
        return (
            "the reference looks like a worked solution (a '#### x' line or a \\boxed{} inside "
            "it); set reference_kind: solution (reward_fn: math_answer:reference_kind=solution)"
        )
    return "the reference is empty"


class ExactMatch:
    name = "exact_match"
    description = BUILTIN_FUNCTIONS["exact_match"].description

    def __init__(self, name: str = "exact_match", strip: bool = True):
        self.name, self.strip = name, strip

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        if self.strip:
            return [Score(float(i.completion.strip() == i.reference.strip())) for i in items]
        return [Score(float(i.completion == i.reference)) for i in items]


class FormatReward:
    name = "format"
    description = BUILTIN_FUNCTIONS["format"].description

    _PATTERN = re.compile(r"^\s*(\\boxed\{[-+]?\d[\d,./]*\}|[-+]?\d[\d,./]*)\s*$")

    def __init__(self, name: str = "format", pattern: str = ""):
        self.name = name
        if pattern:
            self._PATTERN = re.compile(pattern)

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        return [Score(1.0 if self._PATTERN.match(i.completion) else 0.0) for i in items]
