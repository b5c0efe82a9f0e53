"""Every config section rejects unknown keys and documents every field (the --help of a
service and the reference docs are generated from these descriptions)."""

import importlib
from pathlib import Path

from brorl.config.base import StrictModel

ROOT = Path(__file__).resolve().parents[2]
CONFIG_MODULES = [
    "brorl.config.run",
    "brorl.config.monitors",
    "brorl.config.sampling",
    "brorl.config.tracking",
    "brorl.security",
    "services.learner.config",
    "services.rollout.config",
    "services.reward.config",
    "services.reward.pipeline_config",
    "brorl.apps.demo_cmd",
    "brorl.apps.sweep_cmd",
]


def strict_models():
    for name in CONFIG_MODULES:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, StrictModel)
                and obj is not StrictModel
                and obj.__module__ == module.__name__
            ):
                yield obj


def test_the_config_modules_exist_and_hold_models():
    assert len(list(strict_models())) >= 15


def test_every_config_field_has_a_description():
    missing = [
        f"{m.__module__}.{m.__name__}.{f}"
        for m in strict_models()
        for f, info in m.model_fields.items()
        if not (info.description or "").strip()
    ]
    assert not missing, f"fields without a description: {missing}"


def test_every_config_section_rejects_unknown_keys():
    loose = [m.__name__ for m in strict_models() if m.model_config.get("extra") != "forbid"]
    assert not loose
