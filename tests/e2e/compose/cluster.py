"""docker-compose.yml's cpu profile driven from the host: `up` on free host ports, health waited
for with a failing service named (and its last log lines shown) as soon as it fails, `--scale`,
a container killed, `down -v`.

`up -d` runs in the background while the containers are watched through `docker inspect`, so a
container that exits or restarts fails the wait at once (`--wait` would sit out its retries).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from brorl.contract import KeyName
from tests.e2e.compose.engine import EngineError, compose_env, sh
from tests.e2e.compose.images import CPU_IMAGE, REDIS_IMAGE, REPO
from tests.ports import free_ports

CI_FILE = Path(__file__).with_name("ci.yml")
NAMESPACE = KeyName.DEFAULT_NAMESPACE  # docker-compose.yml's services set none: their runs' keys
PORT_VARS = (
    "BRORL_REDIS_HOST_PORT",
    "BRORL_REWARD_PORT",
    "BRORL_REWARD_METRICS_PORT",
    "BRORL_LEARNER_PORT",
    "BRORL_LEARNER_METRICS_PORT",
)


class ServiceFailed(RuntimeError):
    """A service's container exited, restarted or turned unhealthy: the message names it and
    shows its last log lines."""


@dataclass
class Compose:
    """One compose project of the cpu profile: a unique name, free ports, a mounted model."""

    project: str
    model_dir: Path
    datasets_dir: Path
    secrets_dir: Path
    cpu_image: str = CPU_IMAGE
    ports: dict[str, int] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)  # container ids killed on purpose

    def __post_init__(self):
        if not self.ports:
            self.ports = dict(zip(PORT_VARS, free_ports(len(PORT_VARS))))

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **compose_env(),
            "BRORL_MODEL_DIR": str(self.model_dir),
            "BRORL_DATASETS_DIR": str(self.datasets_dir),
            "BRORL_SECRETS_DIR": str(self.secrets_dir),
            "BRORL_REDIS_IMAGE": REDIS_IMAGE,
            "BRORL_CPU_IMAGE": self.cpu_image,
            **{k: str(v) for k, v in self.ports.items()},
        }

    @property
    def learner_address(self) -> str:
        return f"127.0.0.1:{self.ports['BRORL_LEARNER_PORT']}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.ports['BRORL_REDIS_HOST_PORT']}/0"

    def argv(self, *args: str) -> list[str]:
        return [
            "docker",
            "compose",
            "-p",
            self.project,
            "--project-directory",
            str(REPO),
            "-f",
            str(REPO / "docker-compose.yml"),
            "-f",
            str(CI_FILE),
            "--profile",
            "cpu",
            *args,
        ]

    def run(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise RuntimeError(f"docker compose {' '.join(args)}: {proc.stderr.strip()[-3000:]}")
        return proc.stdout

    def containers(self, service: str | None = None) -> list[dict]:
        """`docker inspect` of the project's containers (of one service), oldest first."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = sh("docker", "ps", "-aq", *filters).stdout.split()
        if not ids:
            return []
        found = json.loads(sh("docker", "inspect", *ids).stdout)
        return sorted(found, key=lambda c: c["Created"])

    def up(
        self, services: list[str], scale: dict[str, int] | None = None, timeout: float = 600
    ) -> float:
        """`up -d` of ``services`` (with dependencies) and wait until every container of the
        project is healthy; seconds taken. A service that fails raises ServiceFailed at once."""
        t0 = time.monotonic()
        extra = [f"--scale={k}={v}" for k, v in (scale or {}).items()]
        running = {c["Id"] for c in self.containers()}  # judged by exits, not by health
        proc = subprocess.Popen(
            self.argv("up", "-d", "--no-build", "--no-recreate", *extra, *services),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            self.wait_healthy(proc, t0 + timeout, running)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return time.monotonic() - t0

    def wait_healthy(self, proc: subprocess.Popen, deadline: float, running: set[str]) -> None:
        while True:
            done = proc.poll() is not None
            if done and proc.returncode != 0:
                output = proc.stdout.read().strip()[-1500:]
                self.raise_failed(f"docker compose up exited {proc.returncode}: {output}")
            states = self.containers()
            self.raise_failed(health_of_new_only=running)
            live = [c for c in states if c["Id"] not in self.killed | running]
            if done and all(_health(c) == "healthy" for c in live):
                return
            if time.monotonic() > deadline:
                waiting = [
                    f"{service_of(c)}: {_health(c)}" for c in live if _health(c) != "healthy"
                ]
                raise ServiceFailed(f"not healthy in time: {waiting}\n" + self.logs_of(live))
            time.sleep(1.0)

    def raise_failed(self, why: str = "", health_of_new_only: set[str] = frozenset()) -> None:
        """ServiceFailed naming every container that exited, restarted or is unhealthy (the
        containers in ``health_of_new_only``, already up before, only for exits and restarts:
        a health check that times out on a loaded machine does not stop them)."""
        bad = [
            c
            for c in self.containers()
            if c["Id"] not in self.killed and _failed(c, c["Id"] not in health_of_new_only)
        ]
        if bad or why:
            lines = [why] if why else []
            for c in bad:
                s = c["State"]
                lines.append(
                    f"service {service_of(c)} ({c['Name'].lstrip('/')}) failed: status "
                    f"{s['Status']}, exit code {s['ExitCode']}, restarts {c['RestartCount']}, "
                    f"health {_health(c)}"
                )
            raise ServiceFailed("\n".join(lines) + "\n" + self.logs_of(bad))

    def logs_of(self, containers: list[dict], lines: int = 15) -> str:
        out = []
        for c in containers:
            proc = sh("docker", "logs", "--tail", str(lines), c["Id"], check=False)
            text = (proc.stdout + proc.stderr).rstrip()
            out.append(
                f"--- last {lines} log lines of {service_of(c)} ({c['Name'].lstrip('/')}):\n{text}"
            )
        return "\n".join(out)

    def kill(self, container_id: str) -> None:
        """SIGKILL one container (paused or not), as a crashed node would be.

        A paused container's processes get their SIGKILL while still frozen: `docker kill`
        signals only the container's init and thaws the container to deliver it, and until
        the init's death takes the rest along the others run again for some milliseconds (a
        frozen worker published a job 23 ms after its held jobs were read). A signal pending
        when a frozen process thaws is taken before it runs another instruction."""
        self.killed.add(container_id)
        for pid in container_pids(container_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sh("docker", "kill", container_id, check=False)  # may have died already (cgroup v2)
        deadline = time.monotonic() + 30
        while (
            sh("docker", "inspect", "--format", "{{.State.Running}}", container_id).stdout.strip()
            == "true"
        ):
            if time.monotonic() > deadline:
                raise EngineError(f"container {container_id[:12]} still running after docker kill")
            time.sleep(0.1)

    def pause(self, container_id: str) -> bool:
        """Freeze every process of a container (the cgroup freezer): it does nothing until
        unpaused or killed. False when the freezer gave up (runc's "unable to freeze": a busy
        cgroup did not reach the frozen state in runc's time, and runc thawed it again), so
        the caller may try again; any other failure raises."""
        try:
            sh("docker", "pause", container_id)
        except EngineError as err:
            if "unable to freeze" in str(err):
                return False
            raise
        return True

    def unpause(self, container_id: str) -> None:
        sh("docker", "unpause", container_id)

    def down(self) -> float:
        t0 = time.monotonic()
        self.run("down", "-v", "--remove-orphans", "--timeout", "10", timeout=300)
        return time.monotonic() - t0

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes of this project still there."""
        label = f"label=com.docker.compose.project={self.project}"
        left = []
        for kind, cmd in (
            ("container", ["ps", "-aq"]),
            ("network", ["network", "ls", "-q"]),
            ("volume", ["volume", "ls", "-q"]),
        ):
            ids = sh("docker", *cmd, "--filter", label).stdout.split()
            left += [f"{kind} {i}" for i in ids]
        return left


def service_of(c: dict) -> str:
    return c["Config"]["Labels"].get("com.docker.compose.service", c["Name"])


def _health(c: dict) -> str:
    health = c["State"].get("Health")
    return health["Status"] if health else c["State"]["Status"]


def _failed(c: dict, judge_health: bool = True) -> bool:
    s = c["State"]
    return (
        s["Status"] in ("exited", "dead", "restarting")
        or c["RestartCount"] > 0
        or (judge_health and _health(c) == "unhealthy")
    )


def container_pids(container_id: str) -> list[int]:
    """The host pids of every process in a container's cgroup (frozen or not), from its init's
    /proc/<pid>/cgroup: the freezer's hierarchy under cgroup v1, the unified one under v2."""
    pid = int(sh("docker", "inspect", "--format", "{{.State.Pid}}", container_id).stdout)
    if pid <= 0:  # not running
        return []
    paths = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        paths[controllers] = path
    if "freezer" in paths:
        procs = Path("/sys/fs/cgroup/freezer") / paths["freezer"].lstrip("/") / "cgroup.procs"
    else:
        procs = Path("/sys/fs/cgroup") / paths[""].lstrip("/") / "cgroup.procs"
    return [int(p) for p in procs.read_text().split()]
