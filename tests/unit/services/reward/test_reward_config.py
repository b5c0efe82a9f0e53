import pytest

from brorl.config.base import load_config, validate
from brorl.errors import InvalidArgument
from services.reward.config import DEFAULT_FUNCTIONS, RewardServiceConfig
from services.reward.registry import build_registry, default_registry


def test_defaults_cover_math_answer_and_format():
    cfg = RewardServiceConfig()
    assert set(cfg.functions) == {"math_answer", "format"}
    registry = default_registry()
    assert set(DEFAULT_FUNCTIONS) <= set(registry.names())
    registry.close()


def test_example_config_file_loads(tmp_path):
    from pathlib import Path

    path = Path(__file__).resolve().parents[4] / "configs" / "reward.yaml"
    cfg = load_config(RewardServiceConfig, path, env_prefix=None)
    assert cfg.functions["rlhf_mix"].type == "composite"
    assert cfg.functions["math_strict"].type == "pipeline"


@pytest.mark.parametrize(
    "functions,field,fix",
    [
        (
            {"m": {"type": "composite", "components": {"relevance": "abc"}}},
            "functions.m.composite.components.relevance",
            "valid number",
        ),
        (
            {"m": {"type": "composite", "components": {}}},
            "functions.m.composite.components",
            "at least one",
        ),
        (
            {"m": {"type": "composite", "components": {"relevance": 0}}},
            "functions.m.composite.components",
            "all weights are 0",
        ),
        ({"m": {"type": "bogus"}}, "functions.m", "does not match any of the expected tags"),
        ({"m": {"type": "code", "wall_s": -1}}, "functions.m.code.wall_s", "greater than 0"),
        ({"m": {"type": "code", "typo": 1}}, "functions.m.code.typo", "unknown key"),
        ({"m": {"type": "judge"}}, "functions.m.judge.base_url", "Field required"),
        (
            {"m": {"type": "pipeline", "scorer": "x", "forbid_regex": ["("]}},
            "functions.m.pipeline.forbid_regex",
            "not a valid regular expression",
        ),
        ({"a:b": {"type": "format"}}, "functions", "without ':'"),
    ],
)
def test_bad_function_config_names_the_field(functions, field, fix):
    with pytest.raises(InvalidArgument) as err:
        validate(RewardServiceConfig, {"functions": functions})
    assert err.value.field == field and fix in str(err.value)


def test_registry_rejects_unknown_components_and_cycles():
    cfg = RewardServiceConfig(functions={"m": {"type": "composite", "components": {"nope": 1.0}}})
    with pytest.raises(InvalidArgument, match="uses unknown function 'nope'"):
        build_registry(cfg)
    cfg = RewardServiceConfig(
        functions={
            "a": {"type": "composite", "components": {"b": 1.0}},
            "b": {"type": "pipeline", "scorer": "a"},
        }
    )
    with pytest.raises(InvalidArgument, match="depends on itself"):
        build_registry(cfg)


def test_reward_model_path_must_hold_a_model(tmp_path):
    cfg = RewardServiceConfig(functions={"rm": {"type": "reward_model", "path": str(tmp_path)}})
    with pytest.raises(InvalidArgument, match="rm_train"):
        build_registry(cfg)


def test_listed_default_replaces_its_settings():
    registry = build_registry(
        RewardServiceConfig(functions={"format": {"type": "format", "pattern": "^yes$"}})
    )
    from services.reward.base import ScoreItem

    [s] = registry.score("format", [ScoreItem("a", "", "yes", "")])
    assert s.reward == 1.0
    registry.close()
