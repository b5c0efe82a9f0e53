"""One owner for every default and name that two processes must agree on (docs/design.md "One
owner per rule"): the cluster's ports and Redis URL (brorl/cluster.py), the reward statuses and
the consumer groups (brorl/contract.py). A second literal copy anywhere in source fails here, and
the files that cannot import Python (docker-compose.yml, the Kubernetes manifests) are checked
against the owners.

Mutations tried, each failing a test below: ``status="timeout"`` as a keyword in
services/reward/functions/code_reward.py; ``path.reward_status == "filtered"`` in
services/learner/observe/step_metrics.py; ``return fail("error", ...)`` (a positional status);
``StreamQueue(r, key, "rollout")`` in brorl/queue.py; the reward config's bind default written
as ``"127.0.0.1:50052"``; the learner's bind in docker-compose.yml as 50054; the KEDA scaler's
consumerGroup as ``rollouts``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from brorl import cluster
from brorl.contract import ConsumerGroup, RewardStatus

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ("brorl", "services", "envs", "kernels", "demo", "bench", "scripts", "docker")
PORTS = {
    cluster.ROLLOUT_PORT,
    cluster.ENV_PORT,
    cluster.DEFAULT.reward_port,
    cluster.DEFAULT.learner_port,
    cluster.DEFAULT.rollout_base_port,
    cluster.REDIS_PORT,
    *cluster.METRICS_PORTS.values(),
}
PORT_RE = re.compile(r"(?<!\d)(" + "|".join(str(p) for p in sorted(PORTS)) + r")(?!\d)")
OWNERS = {"brorl/cluster.py", "brorl/contract.py"}


def source_files():
    for folder in SOURCE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if "/v1/" not in rel and rel not in OWNERS:
                yield rel, ast.parse(path.read_text())


def test_no_port_or_redis_url_is_written_outside_brorl_cluster():
    found = []
    for rel, tree in source_files():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (int, str)):
                if not isinstance(node.value, bool) and PORT_RE.search(str(node.value)):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "ports belong to brorl/cluster.py:\n" + "\n".join(found)


def test_the_defaults_of_every_service_config_come_from_the_cluster_layout():
    from envs.config import EnvServiceConfig
    from services.learner.config import LearnerServiceConfig
    from services.reward.config import RewardServiceConfig
    from services.rollout.config import RolloutServiceConfig

    address = cluster.address
    rollout = RolloutServiceConfig(model="m")
    assert rollout.bind == address(cluster.ROLLOUT_PORT)
    assert rollout.reward_address == address(cluster.DEFAULT.reward_port)
    assert RewardServiceConfig().bind == address(cluster.DEFAULT.reward_port)
    assert LearnerServiceConfig().bind == address(cluster.DEFAULT.learner_port)
    assert EnvServiceConfig(env="dialogue").bind == address(cluster.ENV_PORT)
    assert rollout.redis_url == LearnerServiceConfig().redis_url == cluster.REDIS_URL
    metrics = {
        "rollout": rollout.metrics_bind,
        "reward": RewardServiceConfig().metrics_bind,
        "learner": LearnerServiceConfig().metrics_bind,
        "env": EnvServiceConfig(env="calculator").metrics_bind,
    }
    assert metrics == {k: address(p) for k, p in cluster.METRICS_PORTS.items()}


def test_the_launcher_and_the_recipes_share_one_port_layout():
    from brorl.apps import recipe
    from brorl.apps.cluster.launcher import ClusterSpec

    spec = ClusterSpec(model="m", workdir=Path("w"))
    assert {k: getattr(spec, k) for k in cluster.DEFAULT.ports()} == cluster.DEFAULT.ports()
    assert recipe.base_port_layout(cluster.DEFAULT.reward_port) == cluster.DEFAULT.ports()
    assert recipe.base_port_layout(51000) == {
        "reward_port": 51000,
        "learner_port": 51001,
        "env_port": 51002,
        "rollout_base_port": 51010,
    }


def _service_ports(text: str) -> set[int]:
    return {int(m) for m in PORT_RE.findall(text)} | {
        int(m) for m in re.findall(r"(?<![\d.])(5\d{4}|6\d{3}|9\d{3})(?![\d.])", text)
    }


COMMANDS = {  # the `bind` each container's command must pass, and what it calls
    "reward": [f"bind=0.0.0.0:{cluster.DEFAULT.reward_port}"],
    "rollout": [
        f"bind=0.0.0.0:{cluster.ROLLOUT_PORT}",
        f"reward_address=reward:{cluster.DEFAULT.reward_port}",
        f"redis_url=redis://redis:{cluster.REDIS_PORT}/0",
        f"metrics_bind=0.0.0.0:{cluster.METRICS_PORTS['rollout']}",
    ],
    "learner": [
        f"bind=0.0.0.0:{cluster.DEFAULT.learner_port}",
        f"redis_url=redis://redis:{cluster.REDIS_PORT}/0",
    ],
}


@pytest.mark.parametrize(
    "path",
    [
        "docker-compose.yml",
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("deploy/k8s/**/*.yaml")),
    ],
)
def test_compose_and_kubernetes_use_the_cluster_ports(path):
    text = (ROOT / path).read_text()
    strays = _service_ports(text) - PORTS
    assert not strays, f"{path} uses ports {sorted(strays)} that brorl/cluster.py does not name"


def _commands(docs) -> dict[str, str]:
    """service name → its container command, from compose services or k8s workloads."""
    out = {}
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        for name, svc in (doc.get("services") or {}).items():  # compose
            if isinstance(svc, dict) and "command" in svc:
                out[name.split("-")[0]] = " ".join(svc["command"])
        spec = (doc.get("spec") or {}).get("template", {}).get("spec", {})  # k8s workloads
        for c in spec.get("containers", []):
            if "command" in c:
                out[c["name"]] = " ".join(c["command"])
    return out


@pytest.mark.parametrize("path", ["docker-compose.yml", "deploy/k8s/base"])
def test_the_containers_bind_and_call_the_cluster_ports(path):
    target = ROOT / path
    files = [target] if target.is_file() else sorted(target.glob("*.yaml"))
    commands = {}
    for f in files:
        commands.update(_commands(yaml.safe_load_all(f.read_text())))
    for service, wants in COMMANDS.items():
        assert service in commands, (path, service, sorted(commands))
        for want in wants:
            assert want in commands[service], (path, service, want, commands[service])


def test_the_keda_scaler_reads_the_rollout_consumer_group():
    text = (ROOT / "deploy/k8s/base/rollout-scaler.yaml").read_text()
    groups = re.findall(r"consumerGroup:\s*(\S+)", text)
    assert groups and set(groups) == {ConsumerGroup.ROLLOUT}, groups


# ---- reward statuses and consumer groups: no literal copy in a status or group position ------

STATUSES = set(RewardStatus.ALL)
STATUS_NAME = re.compile(r"(^|_)status$")


def _status_literal(node) -> bool:
    if isinstance(node, ast.Constant) and node.value in STATUSES:
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_status_literal(e) for e in node.elts)
    return False


def _named_status(node) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return bool(STATUS_NAME.search(name or ""))


def _status_params(trees) -> dict[str, set[int]]:
    """Function (and dataclass) name → the positional indices of its parameters named *status."""
    out: dict[str, set[int]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
                hits = {i for i, a in enumerate(args) if STATUS_NAME.search(a)}
                if hits:
                    out.setdefault(node.name, set()).update(hits)
            elif isinstance(node, ast.ClassDef):
                fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]
                fields = [f for f in fields if isinstance(f, str)]
                hits = {i for i, f in enumerate(fields) if STATUS_NAME.search(f)}
                if hits:
                    out.setdefault(node.name, set()).update(hits)
    return out


def _status_copies(rel: str, tree, params: dict[str, set[int]]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            hit = any(_named_status(s) for s in sides) and any(_status_literal(s) for s in sides)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            hit = any(
                _named_status(t) and v is not None and _status_literal(v)
                for t, v in zip(flat, values)
            )
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
            positional = params.get(name, set())
            hit = any(
                (kw.arg and STATUS_NAME.search(kw.arg) and _status_literal(kw.value))
                for kw in node.keywords
            ) or any(i in positional and _status_literal(a) for i, a in enumerate(node.args))
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]  # None: a ** unpacking
            hit = bool(keys) and all(_status_literal(k) for k in keys)
        if hit:
            found.append(f"{rel}:{node.lineno}")
    return found


def test_reward_statuses_are_named_by_brorl_contract_only():
    files = list(source_files())
    params = _status_params(tree for _, tree in files)
    found = [hit for rel, tree in files for hit in _status_copies(rel, tree, params)]
    assert not found, "use brorl.contract.RewardStatus:\n" + "\n".join(found)


def test_the_status_check_sees_every_form_of_a_copy():
    params = _status_params([ast.parse("def fail(status, detail): ...")])
    for code in (
        'Score(0.0, status="timeout")',
        'ok = path.reward_status == "filtered"',
        'if s.status in ("ok", "error"): pass',
        'path.verifier_status = "ok"',
        'status, detail = "error", "x"',
        'fail("error", "why")',
        'RANK = {"ok": 0, "timeout": 1}',
    ):
        assert _status_copies("x.py", ast.parse(code), params), code
    assert not _status_copies("x.py", ast.parse('d = {"ok": True, "n": 1}'), params)


def _group_copies(rel: str, tree) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
        group = None
        if name == "StreamQueue":
            group = node.args[2] if len(node.args) > 2 else None
            group = next((k.value for k in node.keywords if k.arg == "group"), group)
        elif name in ("prompt_queue", "path_queue", "xgroup_create", "xinfo_consumers"):
            group = next((a for a in node.args if isinstance(a, ast.Constant)), None)
        if isinstance(group, ast.Constant) and isinstance(group.value, str):
            found.append(f"{rel}:{node.lineno}: {group.value!r}")
    return found


def test_consumer_groups_are_named_by_brorl_contract_only():
    found = [hit for rel, tree in source_files() for hit in _group_copies(rel, tree)]
    assert not found, "use brorl.contract.ConsumerGroup:\n" + "\n".join(found)
    probe = ast.parse('StreamQueue(r, k, "rollout")\nch.prompt_queue("rollout")')
    assert len(_group_copies("x.py", probe)) == 2
