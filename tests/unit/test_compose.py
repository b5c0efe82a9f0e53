"""docker-compose.yml and docker/: checked without a Docker engine (none runs on these machines).

* The compose file validates against the official Compose Specification JSON schema, vendored
  as tests/unit/data/compose-spec.json: an unmodified copy of ``schema/compose-spec.json`` from
  https://github.com/compose-spec/compose-spec at commit
  00655e2222608fa6eaecdf12ac5195889ca2244a (the spec that has top-level ``models`` and service
  ``provider``, ``use_api_socket``, ``gw_priority``; 74,133 bytes, sha256 below). To update it,
  replace the file with a newer schema/compose-spec.json and change SCHEMA_SHA256.
* Every brorl service runs exactly what the local launcher runs (``service_command``), and each
  ``key=value`` override and ``BRORL_*`` environment variable is a valid field of the service's
  config class.
* Health checks, ``depends_on`` conditions, scalability of rollout, the shared data volume and
  the profiles. The images themselves: tests/unit/test_docker_image.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from brorl.apps.cluster import launcher
from brorl.config.base import env_overrides, load_config
from services.learner.config import LearnerServiceConfig
from services.reward.config import RewardServiceConfig
from services.rollout.config import RolloutServiceConfig

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
SCHEMA_FILE = Path(__file__).parent / "data" / "compose-spec.json"
SCHEMA_SHA256 = "bc50c2d79102aed8df21b3a13e56c9396c7a06da6cff5ce37629f2ee7eb41735"
APP_DIR = PurePosixPath("/app")  # WORKDIR of the image; the repository is copied there

CONFIGS: dict[str, type[BaseModel]] = {
    "reward": RewardServiceConfig,
    "rollout": RolloutServiceConfig,
    "learner": LearnerServiceConfig,
}
# Compose service name -> brorl service it runs (the GPU profile has its own rollout and learner).
BRORL_SERVICES = {
    "reward": "reward",
    "rollout": "rollout",
    "learner": "learner",
    "rollout-gpu": "rollout",
    "learner-gpu": "learner",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-)(?P<default>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` / ``${VAR-default}`` with ``env`` (default
    empty)."""
    env = env or {}

    def sub(m: re.Match) -> str:
        name, op, default = m.group("name"), m.group("op"), m.group("default")
        got = env.get(name)
        if op == ":-" and not got:
            return default
        if op == "-" and got is None:
            return default
        return got or ""

    out = _VAR.sub(sub, value)
    assert "$" not in out, f"unsupported interpolation in {value!r} (use ${{VAR:-default}})"
    return out


def split_command(command: list[str]) -> tuple[str, dict[str, str]]:
    """``["python", "-m", module, "k=v", ...]`` -> (module, {k: v})."""
    assert isinstance(command, list), "use the exec (list) form of command:"
    assert command[:2] == ["python", "-m"], command
    overrides = {}
    for item in command[3:]:
        assert "=" in item, f"{item!r} is not key=value"
        key, value = item.split("=", 1)
        overrides[key] = value
    return command[2], overrides


def field_exists(cls: type[BaseModel], dotted: str) -> bool:
    """Whether ``a.b.c`` names a field through nested pydantic models."""
    model = cls
    parts = dotted.split(".")
    for part in parts:
        if (
            not (isinstance(model, type) and issubclass(model, BaseModel))
            or part not in model.model_fields
        ):
            return False
        model = model.model_fields[part].annotation
    return True


def flatten(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        keys += flatten(value, dotted + ".") if isinstance(value, dict) else [dotted]
    return keys


def mounts(service: dict) -> list[dict]:
    """The service's volumes in long syntax (short syntax is converted)."""
    out = []
    for item in service.get("volumes", []):
        if isinstance(item, str):
            parts = item.split(":")
            out.append(
                {
                    "source": parts[0],
                    "target": parts[1],
                    "read_only": len(parts) > 2 and "ro" in parts[2].split(","),
                    "type": "bind" if parts[0].startswith((".", "/", "$", "~")) else "volume",
                }
            )
        else:
            out.append(item)
    return out


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# ---------------------------------------------------------------- schema


def test_vendored_schema_is_the_recorded_copy():
    assert hashlib.sha256(SCHEMA_FILE.read_bytes()).hexdigest() == SCHEMA_SHA256
    jsonschema.Draft7Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


def test_compose_file_validates_against_the_compose_spec_schema(compose):
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA_FILE.read_text()))
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(compose)
    ]
    assert not errors, "\n".join(errors)


def test_schema_rejects_a_misspelt_key(compose):
    """The check has teeth: the schema forbids unknown service keys."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA_FILE.read_text()))
    broken = json.loads(json.dumps(compose))
    broken["services"]["rollout"]["helthcheck"] = broken["services"]["rollout"].pop("healthcheck")
    assert list(validator.iter_errors(broken))


# ---------------------------------------------------------------- commands and config


def test_every_brorl_service_is_covered(services):
    running_brorl = {
        name for name, s in services.items() if "services." in " ".join(s.get("command") or [])
    }
    assert running_brorl == set(BRORL_SERVICES)
    assert set(CONFIGS) == set(launcher.SERVICE_MODULES)


@pytest.mark.parametrize("compose_name", sorted(BRORL_SERVICES))
def test_command_is_the_launchers_command(services, compose_name):
    name = BRORL_SERVICES[compose_name]
    command = services[compose_name]["command"]
    assert not any("$" in part for part in command), (
        "no interpolation in commands: they must equal the launcher's"
    )
    module, overrides = split_command(command)
    assert module == launcher.SERVICE_MODULES[name]
    # The same argv the launcher builds from these overrides (it runs sys.executable, compose
    # `python`).
    assert launcher.service_command(name, overrides)[1:] == command[1:]


@pytest.mark.parametrize("compose_name", sorted(BRORL_SERVICES))
def test_command_overrides_are_valid_config(services, compose_name):
    cls = CONFIGS[BRORL_SERVICES[compose_name]]
    _, overrides = split_command(services[compose_name]["command"])
    for key in overrides:
        assert field_exists(cls, key), f"{compose_name}: {key!r} is not a field of {cls.__name__}"
    config = load_config(cls, None, [f"{k}={v}" for k, v in overrides.items()], env_prefix=None)
    # In a container the server must listen on every interface, not on loopback.
    assert config.bind.startswith("0.0.0.0:"), config.bind


@pytest.mark.parametrize("compose_name", sorted(BRORL_SERVICES))
def test_brorl_environment_is_valid_config(services, compose_name):
    """BRORL_* variables feed the config (below the command line): each must name a real field
    (brorl.config.base drops unknown top-level keys silently, so a typo would go unnoticed)."""
    cls = CONFIGS[BRORL_SERVICES[compose_name]]
    env_spec = services[compose_name].get("environment", {})
    assert isinstance(env_spec, dict), "use the mapping form of environment:"
    env = {k: interpolate(str(v)) for k, v in env_spec.items()}
    for key in flatten(env_overrides("BRORL_", env)):
        assert field_exists(cls, key), (
            f"{compose_name}: BRORL_ variable for {key!r} is not a field of {cls.__name__}"
        )
    _, overrides = split_command(services[compose_name]["command"])
    load_config(
        cls, None, [f"{k}={v}" for k, v in overrides.items()], env_prefix="BRORL_", environ=env
    )


def test_services_reach_each_other_by_compose_name(services):
    for compose_name in ("rollout", "rollout-gpu"):
        _, o = split_command(services[compose_name]["command"])
        assert o["redis_url"] == "redis://redis:6379/0"
        assert (
            o["reward_address"]
            == f"reward:{port_of(split_command(services['reward']['command'])[1]['bind'])}"
        )
    for compose_name in ("learner", "learner-gpu"):
        assert (
            split_command(services[compose_name]["command"])[1]["redis_url"]
            == "redis://redis:6379/0"
        )


# ---------------------------------------------------------------- health and startup order


@pytest.mark.parametrize("compose_name", sorted(BRORL_SERVICES))
def test_grpc_health_check(services, compose_name):
    service = services[compose_name]
    _, overrides = split_command(service["command"])
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]
    script = PurePosixPath(test[2])
    assert (REPO / script.relative_to(APP_DIR)).is_file(), (
        f"{script} is not in the repository copied to {APP_DIR}"
    )
    assert test[3] == f"127.0.0.1:{port_of(overrides['bind'])}"
    assert not service["healthcheck"].get("disable", False)


def test_depends_on_waits_for_healthy_services(services):
    for name, service in services.items():
        deps = service.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions"
        for dep, spec in deps.items():
            assert spec["condition"] == "service_healthy", f"{name} -> {dep}"
            assert "healthcheck" in services[dep], (
                f"{name} waits for {dep}, which has no healthcheck"
            )
    for rollout in ("rollout", "rollout-gpu"):
        assert {"redis", "reward"} <= set(services[rollout]["depends_on"])
    for learner in ("learner", "learner-gpu"):
        assert "redis" in services[learner]["depends_on"]
    # BRORL_REDIS_IMAGE swaps it (the compose test's local Redis); the default is the public one.
    assert interpolate(services["redis"]["image"], {}).startswith("redis:7")


# ---------------------------------------------------------------- scaling, volumes, profiles


@pytest.mark.parametrize("compose_name", ["rollout", "rollout-gpu"])
def test_rollout_scales(services, compose_name):
    service = services[compose_name]
    assert "container_name" not in service
    assert "ports" not in service, "a fixed host port stops `--scale rollout=K` (use expose:)"
    # Redis consumer names are host + pid: a fixed hostname would give replicas the same name.
    assert "hostname" not in service
    assert "scale" not in service and "replicas" not in service.get("deploy", {})


@pytest.mark.parametrize(
    "learner_name, rollout_name", [("learner", "rollout"), ("learner-gpu", "rollout-gpu")]
)
def test_learner_and_rollout_share_the_data_volume(compose, services, learner_name, rollout_name):
    learner_m = {m["target"]: m for m in mounts(services[learner_name])}
    rollout_m = {m["target"]: m for m in mounts(services[rollout_name])}
    shared = [
        t
        for t, m in learner_m.items()
        if m["type"] == "volume"
        and m["source"] in (compose.get("volumes") or {})
        and t in rollout_m
        and rollout_m[t]["source"] == m["source"]
    ]
    assert len(shared) == 1, "one named volume mounted at the same path in learner and rollout"
    target = PurePosixPath(shared[0])
    assert not learner_m[shared[0]].get("read_only"), "the learner writes the weight store"
    _, o = split_command(services[learner_name]["command"])
    # Weight pointers carry absolute paths: the store must lie inside the shared mount.
    assert PurePosixPath(o["runs_dir"]).is_relative_to(target)
    if o.get("weights_dir"):
        assert PurePosixPath(o["weights_dir"]).is_relative_to(target)
    # The model: a read-only bind mount of a host directory, at the same path in both.
    _, ro = split_command(services[rollout_name]["command"])
    model = PurePosixPath(ro["model"])
    for m in (learner_m, rollout_m):
        mount = next(v for t, v in m.items() if model.is_relative_to(t))
        assert mount["type"] == "bind" and mount.get("read_only") is True
        assert mount["source"].startswith("${BRORL_MODEL_DIR")


def test_profiles(services):
    assert "profiles" not in services["redis"], "redis starts with either profile"
    for name in ("reward", "rollout", "learner"):
        assert "cpu" in services[name]["profiles"]
    for name in ("rollout-gpu", "learner-gpu"):
        assert services[name]["profiles"] == ["gpu"]
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any("gpu" in d["capabilities"] for d in devices)
    assert services["learner"]["environment"]["DS_ACCELERATOR"] == "cpu"


# ---------------------------------------------------------------- Dockerfile and build context
