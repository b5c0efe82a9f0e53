"""deploy/k8s, checked offline: each overlay renders with `kubectl kustomize`, every object
validates against the Kubernetes JSON schemas bundled in the PyPI package kubernetes-validate
(strict: unknown fields are errors), and the KEDA ScaledObject against
tests/unit/data/keda-scaledobject-v1alpha1.json, a schema written from KEDA's documented spec.
Then what the schemas cannot know: the services run the launcher's commands with valid config,
the ScaledObject scales the rollout Deployment on the run's prompt stream and consumer group,
probes ask the gRPC health service on the serving port, learner and rollout share the weight
store's volume at the same path, and the gpu overlay asks for GPUs. No cluster is needed; what
only a real cluster shows is listed in docs/kubernetes.md."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path, PurePosixPath

import jsonschema
import kubernetes_validate
import pytest
import yaml

from brorl import queue
from brorl.apps.cluster import launcher
from brorl.config.base import env_overrides, load_config
from brorl.contract import KeyName
from services.learner.config import LearnerServiceConfig
from services.reward.config import RewardServiceConfig
from services.rollout.config import RolloutServiceConfig
from tests.unit.test_compose import field_exists, flatten, interpolate, split_command

REPO = Path(__file__).resolve().parents[3]
OVERLAYS = ["cpu", "gpu"]
# Ids that are not the bare word "gpu": tests/conftest.py skips items with a `gpu` keyword.
OVERLAY_IDS = [f"overlays/{name}" for name in OVERLAYS]
KEDA_SCHEMA = REPO / "tests" / "unit" / "data" / "keda-scaledobject-v1alpha1.json"
# Native gRPC probes are GA from Kubernetes 1.27; validate against that and the newest schemas
# the installed kubernetes-validate bundles.
K8S_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
CONFIGS = {
    "reward": RewardServiceConfig,
    "rollout": RolloutServiceConfig,
    "learner": LearnerServiceConfig,
}
WORKLOADS = ("Deployment", "StatefulSet")


@lru_cache(maxsize=None)
def _render(overlay: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed: it renders the kustomize overlays (offline)")
    done = subprocess.run(
        [kubectl, "kustomize", str(REPO / "deploy" / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def rendered(overlay: str) -> list[dict]:
    """A fresh copy of the overlay's objects (tests may change what they get)."""
    return [doc for doc in yaml.safe_load_all(_render(overlay)) if doc]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def brorl_containers(objects: list[dict]):
    """(workload, container, brorl service name) for every container running a brorl service."""
    for obj in objects:
        if obj["kind"] not in WORKLOADS:
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            module = (c.get("command") or [None] * 3)[2]
            if module in launcher.SERVICE_MODULES.values():
                name = next(k for k, v in launcher.SERVICE_MODULES.items() if v == module)
                yield obj, c, name


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def keda_validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(KEDA_SCHEMA.read_text()))


# ---------------------------------------------------------------- schemas


def test_keda_schema_is_a_valid_draft7_schema():
    jsonschema.Draft7Validator.check_schema(json.loads(KEDA_SCHEMA.read_text()))


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_every_object_validates_offline(overlay, version):
    errors = []
    for obj in rendered(overlay):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"].startswith("keda.sh/"):
            errors += [f"{where}: {e.message}" for e in keda_validator().iter_errors(obj)]
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_the_schemas_have_teeth():
    """A misspelt field and a wrong type fail the Kubernetes schemas, and a misspelt
    redis-streams setting fails the KEDA schema."""
    objects = rendered("cpu")
    rollout = one(objects, "Deployment", "rollout")
    misspelt = copy.deepcopy(rollout)
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, K8S_VERSIONS[-1], strict=True)
    wrong_type = copy.deepcopy(rollout)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSIONS[-1], strict=True)
    scaler = one(objects, "ScaledObject", "rollout")
    assert not list(keda_validator().iter_errors(scaler))
    scaler["spec"]["triggers"][1]["metadata"]["pendingEntryCount"] = "1"
    assert list(keda_validator().iter_errors(scaler))
    del scaler["spec"]["triggers"][1]["metadata"]["pendingEntryCount"]
    del scaler["spec"]["triggers"][0]["metadata"]["consumerGroup"]  # lag means nothing without it
    assert list(keda_validator().iter_errors(scaler))


# ---------------------------------------------------------------- KEDA


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_scaled_object_scales_rollout_on_the_prompt_stream(overlay):
    objects = rendered(overlay)
    scaler = one(objects, "ScaledObject", "rollout")
    target = scaler["spec"]["scaleTargetRef"]
    rollout = one(objects, "Deployment", target["name"])
    assert (target.get("kind", "Deployment"), target.get("apiVersion", "apps/v1")) == (
        "Deployment",
        "apps/v1",
    )
    assert any(name == "rollout" for _, _, name in brorl_containers([rollout]))
    assert "replicas" not in rollout["spec"], "KEDA's HPA owns the replica count"

    run_id = one(objects, "ConfigMap", "brorl-run")["data"]["run_id"]
    redis_service = one(objects, "Service", "redis")
    namespace = redis_service["metadata"]["namespace"]
    port = redis_service["spec"]["ports"][0]["port"]
    # The group the workers consume the run's prompt stream as (brorl.queue's one table).
    group = queue.CONSUMERS["prompts"]
    # the brorl namespace the learner and the workers share (their commands', else the default)
    [cluster] = {
        split_command(c["command"])[1].get("namespace", KeyName.DEFAULT_NAMESPACE)
        for _, c, name in brorl_containers(objects)
        if name in ("learner", "rollout")
    }
    triggers = scaler["spec"]["triggers"]
    assert triggers and all(t["type"] == "redis-streams" for t in triggers)
    for t in triggers:
        meta = t["metadata"]
        assert meta["stream"] == queue.keys(run_id, namespace=cluster)["prompts"]
        assert meta["consumerGroup"] == group
        # KEDA's operator runs in its own namespace: the address must name this one.
        assert meta["address"] == f"redis.{namespace}.svc:{port}"
    modes = {("lag" if "lagCount" in t["metadata"] else "pending") for t in triggers}
    assert modes == {"lag", "pending"}, "lag sees queued jobs, pending keeps busy workers"
    assert {t["metadata"].get("pendingEntriesCount") for t in triggers} >= {"1"}
    spec = scaler["spec"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]


# ---------------------------------------------------------------- commands and config


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_services_run_the_launchers_commands_with_valid_config(overlay, tmp_path):
    objects = rendered(overlay)
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    seen = set()
    # A token file that exists, so that the security section loads as it does in a pod.
    token = tmp_path / "token"
    token.write_text("0123456789abcdef" * 2)
    for _, container, name in brorl_containers(objects):
        seen.add(name)
        command = container["command"]
        module, overrides = split_command(command)
        assert launcher.service_command(name, overrides)[1:] == command[1:]
        # The same command as compose's: one way to run each service.
        assert command == compose[name]["command"]
        cls = CONFIGS[name]
        for key in overrides:
            assert field_exists(cls, key), f"{name}: {key!r} is not a config field"
        env = {k: e.get("value", "") for k, e in env_of(container).items()}
        for key in flatten(env_overrides("BRORL_", env)):
            assert field_exists(cls, key), f"{name}: BRORL_ variable for {key!r} is no field"
        env["BRORL_SECURITY__TOKEN_FILE"] = str(token)
        config = load_config(cls, None, [f"{k}={v}" for k, v in overrides.items()], environ=env)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert config.bind == f"0.0.0.0:{ports['grpc']}"
    assert seen == set(launcher.SERVICE_MODULES)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_probes_ask_the_grpc_health_service_on_the_serving_port(overlay):
    for workload, container, name in brorl_containers(rendered(overlay)):
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == port, f"{name} {probe}"
        # The startup probe covers loading (a vLLM engine: minutes); liveness starts after it.
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_services_select_their_pods_and_ports(overlay):
    objects = rendered(overlay)
    workloads = [o for o in objects if o["kind"] in WORKLOADS]
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matched = [
            w
            for w in workloads
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matched) == 1, f"Service {service['metadata']['name']} selects {len(matched)}"
        ports = {
            p["name"]
            for c in matched[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for p in service["spec"]["ports"]:
            assert p["targetPort"] in ports
    # rollout and learner reach these by name (their commands say reward:PORT, redis:PORT).
    rollout_overrides = split_command(
        next(c for _, c, n in brorl_containers(objects) if n == "rollout")["command"]
    )[1]
    reward_port = one(objects, "Service", "reward")["spec"]["ports"][0]["port"]
    assert rollout_overrides["reward_address"] == f"reward:{reward_port}"
    learner = one(objects, "StatefulSet", "learner")
    assert learner["spec"]["replicas"] == 1
    assert one(objects, "Service", learner["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


# ---------------------------------------------------------------- volumes, Redis, auth


def _mounts(workload: dict, container: dict) -> dict[str, dict]:
    """mountPath -> mount, with the claim (or secret) of its volume."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    out = {}
    for m in container.get("volumeMounts", []):
        out[m["mountPath"]] = {**m, "volume": volumes[m["name"]]}
    return out


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_learner_and_rollout_share_the_weight_store(overlay):
    objects = rendered(overlay)
    by_name = {name: (w, c) for w, c, name in brorl_containers(objects)}
    learner, rollout = _mounts(*by_name["learner"]), _mounts(*by_name["rollout"])
    claim = learner["/data"]["volume"]["persistentVolumeClaim"]["claimName"]
    assert rollout["/data"]["volume"]["persistentVolumeClaim"]["claimName"] == claim
    assert "ReadWriteMany" in one(objects, "PersistentVolumeClaim", claim)["spec"]["accessModes"]
    assert not learner["/data"].get("readOnly") and rollout["/data"]["readOnly"]
    # Weight pointers carry absolute paths under the learner's runs_dir (brorl/weights/store.py).
    learner_args = split_command(by_name["learner"][1]["command"])[1]
    assert PurePosixPath(learner_args["runs_dir"]).is_relative_to("/data")
    # The initial policy: one directory of the volume, read-only at /model in both.
    model = split_command(by_name["rollout"][1]["command"])[1]["model"]
    for mounts in (learner, rollout):
        assert mounts[model]["subPath"] == "model" and mounts[model]["readOnly"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_redis_persists_to_a_claim_and_matches_compose(overlay):
    objects = rendered(overlay)
    redis = one(objects, "Deployment", "redis")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    data_dir = args[args.index("--dir") + 1]
    claim = _mounts(redis, container)[data_dir]["volume"]["persistentVolumeClaim"]["claimName"]
    one(objects, "PersistentVolumeClaim", claim)
    assert redis["spec"]["strategy"]["type"] == "Recreate", "one writer of the append-only file"
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["redis"]
    assert container["image"] == interpolate(compose["image"], {})
    assert re.fullmatch(r"redis:7\.\d+\.\d+", container["image"]), "an exact Redis 7 tag"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_every_service_reads_the_token_from_the_auth_secret(overlay):
    objects = rendered(overlay)
    assert not [o for o in objects if o["kind"] == "Secret"], "no token in the repository"
    for workload, container, name in brorl_containers(objects):
        path = PurePosixPath(env_of(container)["BRORL_SECURITY__TOKEN_FILE"]["value"])
        mount = _mounts(workload, container)[str(path.parent)]
        secret = mount["volume"]["secret"]
        assert secret["secretName"] == "brorl-auth" and mount["readOnly"], name
        assert {i["key"]: i["path"] for i in secret["items"]} == {"token": path.name}


# ---------------------------------------------------------------- cpu and gpu


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_overlay_picks_its_image_and_accelerator(overlay):
    objects = rendered(overlay)
    for workload, container, name in brorl_containers(objects):
        assert container["image"] == f"brorl:{overlay}", name
        gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
        if name in ("learner", "rollout"):
            assert (int(gpus) >= 1) == (overlay == "gpu"), f"{name}: nvidia.com/gpu {gpus}"
        if name == "learner":
            want = "cuda" if overlay == "gpu" else "cpu"
            assert env_of(container)["DS_ACCELERATOR"]["value"] == want
