"""The local cluster's service command lines: overrides as ``key=value``, nested ones as dotted
keys, which the services' config loader reads back into the same settings."""

from brorl.apps.cluster.launcher import service_command
from brorl.config.base import load_config
from services.reward.config import RewardServiceConfig


def test_nested_overrides_become_dotted_keys_the_service_reads_back():
    overrides = {
        "bind": "127.0.0.1:1",
        "clip": 2.5,
        "functions": {"countdown_fmt": {"type": "countdown", "format_weight": 0.1}},
    }
    argv = service_command("reward", overrides)
    assert argv[1:3] == ["-m", "services.reward"]
    assert argv[3:] == [
        "bind=127.0.0.1:1",
        "clip=2.5",
        "functions.countdown_fmt.type=countdown",
        "functions.countdown_fmt.format_weight=0.1",
    ]
    cfg = load_config(RewardServiceConfig, None, argv[3:], env_prefix=None)
    assert cfg.clip == 2.5
    spec = cfg.functions["countdown_fmt"]
    assert (spec.type, spec.format_weight) == ("countdown", 0.1)


def test_a_list_override_is_written_as_json():
    assert service_command("rollout", {"x": {"y": [1, 2]}})[3:] == ["x.y=[1, 2]"]
