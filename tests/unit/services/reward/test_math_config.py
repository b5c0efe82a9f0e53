"""math_answer's options in a reward service config: defaults, the older rel_tol spelling, and a
one-line error naming the field for every bad value."""

from pathlib import Path

import pytest

from brorl.config.base import load_config, validate
from brorl.errors import InvalidArgument
from services.reward.base import ScoreItem
from services.reward.config import MathAnswerSpec, RewardServiceConfig
from services.reward.registry import build_registry

FIELD = "functions.m.math_answer"


def test_defaults_and_every_field_described():
    spec = MathAnswerSpec()
    assert (spec.reference_kind, spec.strict, spec.percent, spec.units) == (
        "answer",
        True,
        "either",
        "strip",
    )
    assert spec.rounding() == 6 and spec.last_number and spec.symbolic
    assert all(f.description for f in MathAnswerSpec.model_fields.values())


def test_rel_tol_is_the_older_spelling_of_float_rounding():
    assert MathAnswerSpec(rel_tol=1e-6).rounding() == 6
    assert MathAnswerSpec(rel_tol=1e-3).rounding() == 3
    assert MathAnswerSpec(float_rounding=2).rounding() == 2
    path = Path(__file__).resolve().parents[4] / "configs" / "reward.yaml"
    cfg = load_config(RewardServiceConfig, path, env_prefix=None)
    assert cfg.functions["math_answer"].rounding() == 6


def test_options_reach_the_function():
    cfg = validate(
        RewardServiceConfig,
        {
            "functions": {
                "m": {
                    "type": "math_answer",
                    "reference_kind": "solution",
                    "percent": "value",
                    "units": "keep",
                    "float_rounding": 3,
                    "strict": False,
                    "timeout_s": 0.5,
                    "processes": 1,
                }
            }
        },
    )
    registry = build_registry(cfg)
    try:
        fn = registry.get("m")
        assert fn.spec.reference_kind == "solution" and fn.spec.timeout_s == 0.5
        assert (fn.options.percent, fn.options.units, fn.options.float_rounding) == (
            "value",
            "keep",
            3,
        )
        assert fn.options.strict is False
    finally:
        registry.close()


@pytest.mark.parametrize(
    "value,field,fix",
    [
        ({"reference_kind": "sol"}, "reference_kind", "'answer' or 'solution'"),
        ({"percent": "both"}, "percent", "'either' or 'value'"),
        ({"units": "drop"}, "units", "'strip' or 'keep'"),
        ({"float_rounding": -1}, "float_rounding", "greater than or equal to 0"),
        ({"float_rounding": 16}, "float_rounding", "less than or equal to 15"),
        ({"float_rounding": 2.5}, "float_rounding", "valid integer"),
        ({"rel_tol": 0}, "rel_tol", "greater than 0"),
        ({"rel_tol": 1e-6, "float_rounding": 6}, "", "set float_rounding or rel_tol, not both"),
        ({"strict": "maybe"}, "strict", "valid boolean"),
        ({"last_number": "x"}, "last_number", "valid boolean"),
        ({"timeout_s": 0}, "timeout_s", "greater than or equal to 0.05"),
        ({"timeout_s": 3600}, "timeout_s", "less than or equal to 60"),
        ({"processes": 0}, "processes", "greater than or equal to 1"),
        ({"memory_mb": 10}, "memory_mb", "greater than or equal to 256"),
        ({"rel_tol_": 1e-6}, "rel_tol_", "unknown key"),
    ],
)
def test_bad_option_names_the_field(value, field, fix):
    with pytest.raises(InvalidArgument) as err:
        validate(RewardServiceConfig, {"functions": {"m": {"type": "math_answer", **value}}})
    assert err.value.field == (f"{FIELD}.{field}" if field else FIELD)
    assert fix in str(err.value) and "\n" not in str(err.value)


def test_a_run_sets_comparison_options_in_its_reward_fn_name():
    path = Path(__file__).resolve().parents[4] / "configs" / "reward.yaml"
    registry = build_registry(load_config(RewardServiceConfig, path, env_prefix=None))
    try:
        base = registry.get("math_answer")
        name = "math_answer:reference_kind=solution,float_rounding=2,strict=false"
        fn = registry.get(name)
        assert registry.get(name) is fn and fn.name == name
        assert (fn.spec.reference_kind, fn.spec.rounding(), fn.spec.strict) == (
            "solution",
            2,
            False,
        )
        assert fn.spec.timeout_s == base.spec.timeout_s and base.spec.reference_kind == "answer"
        assert fn._workers() is base._workers()  # one set of worker processes
        [score] = registry.score(name, [ScoreItem("a", "", "72", "so 24 + 48 = 72\n#### 72")])
        assert score.reward == 1.0
    finally:
        registry.close()


@pytest.mark.parametrize(
    "name,fix",
    [
        (
            "math_answer:reference_kind=sol",
            "reference_kind: Input should be 'answer' or 'solution'",
        ),
        ("math_answer:timeout_s=60", "belong to the reward service's config"),
        ("math_answer:processes=64", "cannot be set in reward_fn"),
        ("math_answer:units", "is not key=value"),
        ("math_answer:units=keep,units=strip", "given twice"),
        ("math_answer:float_rounding=abc", "float_rounding: Input should be a valid integer"),
        ("math_answer:float_rounding=3,rel_tol=0.01", "not both"),
    ],
)
def test_bad_inline_options_name_the_problem(name, fix):
    registry = build_registry(RewardServiceConfig())
    try:
        with pytest.raises(InvalidArgument) as err:
            registry.get(name)
    finally:
        registry.close()
    assert err.value.field == "reward_fn" and fix in str(err.value)
