"""The cpu overlay's workloads (deploy/k8s) as plain `docker run` containers, without a cluster:
each Deployment/StatefulSet's init containers run to completion, then its containers start with
the manifest's command, args, env, user and volumes, and their probes are asked the way the
kubelet would (a gRPC probe through the image's docker/healthcheck.py, which speaks the same
grpc.health.v1 Check; an exec probe through `docker exec`).

Stand-ins for what a cluster provides: a Service is a network alias of the workload's name on
one Docker network; a PersistentVolumeClaim is a host folder owned by the pod's fsGroup (a
subPath a folder in it; the model folder is the tiny model), or a named volume when the pod sets
no fsGroup; a Secret is a folder holding a test token; a memory emptyDir on /dev/shm is the
container's --shm-size.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.e2e.compose.engine import sh
from tests.e2e.compose.images import CPU_IMAGE, REDIS_IMAGE, REPO

WORKLOADS = ("Deployment", "StatefulSet")


def render(overlay: str = "cpu") -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl is not installed: it renders the kustomize overlays (offline)")
    out = sh(kubectl, "kustomize", str(REPO / "deploy" / "k8s" / "overlays" / overlay)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def local_image(image: str) -> str:
    """The overlay's image names, mapped to the images this machine built."""
    return REDIS_IMAGE if image.split(":")[0].endswith("redis") else CPU_IMAGE


def _size_bytes(quantity: str) -> int:
    number, unit = re.match(r"^(\d+)([KMGT]i)?$", quantity).groups()
    return int(number) * 1024 ** (1 + "KMGT".index(unit[0]) if unit else 0)


@dataclass
class Pods:
    """One workload set on one network; ``start()`` then ``check()``, ``stop()`` always."""

    root: Path
    model_dir: Path
    name: str = field(default_factory=lambda: f"brorl-k8s-{uuid.uuid4().hex[:6]}")
    containers: dict[str, dict] = field(default_factory=dict)  # container name -> its manifest
    volumes: list[str] = field(default_factory=list)

    def start(self, objects: list[dict]) -> None:
        sh("docker", "network", "create", self.name)
        for obj in (o for o in objects if o["kind"] in WORKLOADS):
            self._start_workload(obj)

    def _start_workload(self, obj: dict) -> None:
        workload = obj["metadata"]["name"]
        pod = obj["spec"]["template"]["spec"]
        mounts = self._volumes(workload, pod)
        for init in pod.get("initContainers", []):
            sh(*self._run_argv(workload, pod, init, mounts, detach=False), timeout=120)
        for c in pod["containers"]:
            cname = f"{self.name}-{workload}-{c['name']}"
            sh(*self._run_argv(workload, pod, c, mounts, detach=True, cname=cname))
            self.containers[cname] = c

    def _volumes(self, workload: str, pod: dict) -> dict[str, dict]:
        """Volume name -> how to mount it: {"host": path} or {"volume": name} or {"shm": bytes}."""
        out = {}
        fs_group = (pod.get("securityContext") or {}).get("fsGroup")
        for v in pod.get("volumes", []):
            if "persistentVolumeClaim" in v and fs_group is not None:
                out[v["name"]] = {
                    "host": self._claim_folder(v["persistentVolumeClaim"]["claimName"], fs_group)
                }
            elif "persistentVolumeClaim" in v:
                vol = f"{self.name}-{v['persistentVolumeClaim']['claimName']}"
                self.volumes.append(vol)
                out[v["name"]] = {"volume": vol}
            elif "secret" in v:
                out[v["name"]] = {"host": self._secret_folder(fs_group)}
            elif v.get("emptyDir", {}).get("medium") == "Memory":
                out[v["name"]] = {"shm": _size_bytes(v["emptyDir"].get("sizeLimit", "64Mi"))}
            else:
                raise AssertionError(f"{workload}: volume {v} has no stand-in here")
        return out

    def _claim_folder(self, claim: str, gid: int) -> Path:
        folder = self.root / claim
        if not folder.exists():
            folder.mkdir(parents=True)
            shutil.copytree(self.model_dir, folder / "model")
            (folder / "datasets").mkdir()
            for path in [folder, *folder.rglob("*")]:
                os.chown(path, gid, gid)
        return folder

    def _secret_folder(self, gid: int | None) -> Path:
        folder = self.root / "secret"
        if not folder.exists():
            folder.mkdir(parents=True)
            token = folder / "token"
            token.write_text(uuid.uuid4().hex + "\n")
            os.chown(token, 0, gid or 0)
            token.chmod(0o440)
        return folder

    def _run_argv(
        self, workload, pod, c, mounts, detach: bool, cname: str | None = None
    ) -> list[str]:
        argv = ["docker", "run", "--network", self.name, "--network-alias", workload]
        argv += ["-d", "--name", cname] if detach else ["--rm"]
        sec = pod.get("securityContext") or {}
        if "runAsUser" in sec:
            argv += ["--user", f"{sec['runAsUser']}:{sec.get('runAsGroup', sec['runAsUser'])}"]
        if "fsGroup" in sec:
            argv += ["--group-add", str(sec["fsGroup"])]
        for e in c.get("env", []):
            if "value" in e:
                argv += ["-e", f"{e['name']}={e['value']}"]
        for m in c.get("volumeMounts", []):
            argv += _mount_flags(mounts[m["name"]], m)
        command, args = c.get("command"), c.get("args", [])
        if command:
            argv += ["--entrypoint", command[0]]
        return [*argv, local_image(c["image"]), *(command[1:] if command else []), *args]

    def check(self, timeout: float = 420) -> dict[str, float]:
        """Wait for each container's startup (or readiness) probe, then ask readiness and
        liveness once; seconds until each answered. A container that exits fails with its logs."""
        t0, ready = time.monotonic(), {}
        deadline = t0 + timeout
        while len(ready) < len(self.containers):
            for cname, c in self.containers.items():
                if cname in ready:
                    continue
                state = sh(
                    "docker", "inspect", "--format", "{{.State.Status}}", cname
                ).stdout.strip()
                if state != "running":
                    raise AssertionError(f"{cname} {state}:\n{self.logs(cname)}")
                first = c.get("startupProbe") or c.get("readinessProbe")
                if first is None or probe(cname, first):
                    ready[cname] = time.monotonic() - t0
            if time.monotonic() > deadline:
                waiting = sorted(set(self.containers) - set(ready))
                raise AssertionError(
                    f"no health in {timeout}s: {waiting}\n" + "\n".join(map(self.logs, waiting))
                )
            time.sleep(2)
        for cname, c in self.containers.items():
            for kind in ("readinessProbe", "livenessProbe"):
                if kind in c:
                    assert probe(cname, c[kind]), f"{cname}: {kind} failed\n{self.logs(cname)}"
        return ready

    def logs(self, cname: str, lines: int = 15) -> str:
        proc = sh("docker", "logs", "--tail", str(lines), cname, check=False)
        return f"--- last {lines} log lines of {cname}:\n{(proc.stdout + proc.stderr).rstrip()}"

    def stop(self) -> None:
        for cname in self.containers:
            sh("docker", "rm", "-f", "-v", cname, check=False)
        for vol in self.volumes:
            sh("docker", "volume", "rm", "-f", vol, check=False)
        sh("docker", "network", "rm", self.name, check=False)

    def leftovers(self) -> list[str]:
        left = sh("docker", "ps", "-aq", "--filter", f"name={self.name}").stdout.split()
        left += sh("docker", "network", "ls", "-q", "--filter", f"name={self.name}").stdout.split()
        left += sh("docker", "volume", "ls", "-q", "--filter", f"name={self.name}").stdout.split()
        return left


def _mount_flags(source: dict, m: dict) -> list[str]:
    ro = ",readonly" if m.get("readOnly") else ""
    if "shm" in source:
        return ["--shm-size", str(source["shm"])]
    if "volume" in source:
        return ["--mount", f"type=volume,source={source['volume']},target={m['mountPath']}{ro}"]
    host = Path(source["host"]) / m.get("subPath", "")
    return ["--mount", f"type=bind,source={host},target={m['mountPath']}{ro}"]


def probe(cname: str, spec: dict) -> bool:
    """One probe, as the kubelet would run it, from inside the container."""
    timeout = str(spec.get("timeoutSeconds", 1))
    if "grpc" in spec:
        port = spec["grpc"]["port"]
        argv = ["python", "/app/docker/healthcheck.py", f"127.0.0.1:{port}", "--timeout", timeout]
    elif "exec" in spec:
        argv = list(spec["exec"]["command"])
    else:
        raise AssertionError(f"{cname}: probe {spec} has no stand-in here")
    try:
        proc = subprocess.run(["docker", "exec", cname, *argv], capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0
