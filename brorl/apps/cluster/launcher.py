"""Local cluster: reward, K rollout workers and the learner as separate OS processes (and a
redis-server when none answers). Every process is started by this launcher and stopped by its
own pid — on exit, on Ctrl-C, or when one of them dies.

``service_command`` is the single definition of how a service is started; docker-compose.yml
runs the same commands (a test checks it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from brorl.apps.cluster import placement, scrape_targets
from brorl.rpc import wait_serving
from brorl.security import SecurityConfig
from brorl import cluster, priority

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVICE_MODULES = {
    "reward": "services.reward",
    "rollout": "services.rollout",
    "learner": "services.learner",
}
# What service_command also starts: the environments brorl ships (docs/environments.md), which
# a run reaches at an address of its own and the cluster's deployments do not include.
MODULES = {**SERVICE_MODULES, "env": "envs"}


def service_command(service: str, overrides: dict[str, object] | None = None) -> list[str]:
    """argv that starts ``service`` with ``key=value`` overrides (a nested dict becomes dotted
    keys: {"functions": {"f": {"type": "countdown"}}} → ``functions.f.type=countdown``)."""
    return [sys.executable, "-m", MODULES[service], *_dotted(overrides or {})]


def _dotted(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out += _dotted(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={json.dumps(v) if isinstance(v, (list, dict)) else v}")
    return out


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path


@dataclass
class ClusterSpec:
    model: str
    workdir: Path
    rollout_workers: int = 2
    redis_url: str = cluster.REDIS_URL
    reward_port: int = cluster.DEFAULT.reward_port
    rollout_base_port: int = cluster.DEFAULT.rollout_base_port
    learner_port: int = cluster.DEFAULT.learner_port
    env_port: int = cluster.DEFAULT.env_port
    host: str = cluster.HOST
    rollout_overrides: dict = field(default_factory=dict)
    reward_overrides: dict = field(default_factory=dict)
    learner_overrides: dict = field(default_factory=dict)
    # OMP threads of every process; None: placement.threads_each (the cores split evenly),
    # 0: torch's default of one per core
    threads_per_process: int | None = None
    namespace: str = "default"  # workers follow the learner of their namespace
    rollout_cpu_bind: str = "auto"  # see worker_cpu_bind; every service's cores: placement.py
    # Nice value of the reward and environment services and of the tail processes of workers
    # with background cores: below the learner and the engines (brorl/priority.py); 0: equal.
    background_nice: int = 0
    # Token and TLS of every service and of the launcher's own health checks (docs/security.md).
    security: SecurityConfig | None = None
    # Where run configs may point besides the learner's working directory (the repository), the
    # workdir and the model: the learner's read_roots.
    read_roots: list[str] = field(default_factory=list)
    # An environment service (`python -m envs` with these overrides, e.g. {"env": "calculator"})
    # started with the cluster, for runs of multi-turn episodes; empty: none.
    environment: dict = field(default_factory=dict)


class Cluster:
    """Context manager: ``with Cluster(spec) as c: c.learner_address``."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.procs: list[Proc] = []
        self.logs = spec.workdir / "logs"
        self.ports = spec.workdir / "ports"  # gRPC and metrics port files
        self.redis_url = spec.redis_url
        # what start() placed: the cores it could use, and each service's (None: not pinned)
        self.usable: list[int] = []
        self.cores: dict[str, placement.Cores] = {}

    @functools.cached_property
    def threads(self) -> int:
        """OMP threads of every service: the spec's, or an even share of the cores."""
        s = self.spec
        if s.threads_per_process is not None:
            return s.threads_per_process
        cores = len(os.sched_getaffinity(0))
        return placement.threads_each(cores, s.rollout_workers, self.learner_ranks)

    @property
    def learner_ranks(self) -> int:
        return int(self.spec.learner_overrides.get("ranks") or 1)

    @property
    def learner_address(self) -> str:
        return f"{self.spec.host}:{self.spec.learner_port}"

    @property
    def reward_address(self) -> str:
        return f"{self.spec.host}:{self.spec.reward_port}"

    @property
    def env_address(self) -> str:
        return f"{self.spec.host}:{self.spec.env_port}"

    def rollout_address(self, i: int) -> str:
        return f"{self.spec.host}:{self.spec.rollout_base_port + i}"

    def __enter__(self) -> "Cluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _ports(self, name: str) -> dict[str, str]:
        """Overrides: service ``name`` serves /metrics on a free port and writes its ports."""
        port_file = str(self.ports / f"{name}.port")
        return {"port_file": port_file, "metrics_bind": f"{self.spec.host}:0"}

    def metrics_urls(self) -> dict[str, str]:  # service name → /metrics URL, once ready
        return scrape_targets.metrics_urls(self.spec.host, self.ports, [p.name for p in self.procs])

    def _spawn(
        self, name: str, argv: list[str], cores: placement.Cores = None, nice: int = 0
    ) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        out = open(log_path, "ab")
        # Own process group: a Ctrl-C in the terminal reaches the launcher, which stops children
        # itself.
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=child_env(self.threads),
            start_new_session=True,
        )
        out.close()
        # Popen returns once the child has exec'd, before its interpreter starts any thread
        placement.pin(popen.pid, cores)
        priority.lower(popen.pid, nice)
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
        return proc

    def ensure_redis(self) -> None:
        try:
            redis.Redis.from_url(self.redis_url, socket_connect_timeout=1).ping()
            return
        except redis.RedisError:
            pass
        server = shutil.which("redis-server")
        if not server:
            raise RuntimeError(
                f"no Redis at {self.redis_url} and no redis-server binary to start one"
            )
        port = redis.connection.parse_url(self.redis_url).get("port", cluster.REDIS_PORT)
        self._spawn(
            "redis",
            [
                server,
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--bind",
                "127.0.0.1",
            ],
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.redis_url, socket_connect_timeout=1).ping()
                return
            except redis.RedisError:
                time.sleep(0.1)
        raise RuntimeError(f"started redis-server but {self.redis_url} does not answer")

    def start(self) -> None:
        s = self.spec
        secure = security_overrides(s.security)
        learner, usable = s.learner_overrides, sorted(os.sched_getaffinity(0))
        threads = self.threads or len(usable)  # 0: torch's default, one per core
        cores = placement.placement(
            s.rollout_cpu_bind,
            s.rollout_workers,
            usable,
            worker_threads=threads,
            learner_threads=self.learner_ranks * int(learner.get("torch_threads") or threads),
        )
        self.usable, self.cores = usable, cores
        self.ensure_redis()
        scrape_targets.empty_dir(self.ports)  # an earlier cluster's port files go
        reward = {
            "bind": self.reward_address,
            **self._ports("reward"),
            **secure,
            **s.reward_overrides,
        }
        nice = s.background_nice
        self._spawn("reward", service_command("reward", reward), cores["reward"], nice)
        if s.environment:
            env = {"bind": self.env_address, **self._ports("env"), **secure, **s.environment}
            self._spawn("env", service_command("env", env), cores["env"], nice)
        for i in range(s.rollout_workers):
            # weight staging and the tail process off the engine's cores (rollout/weight_sync.py,
            # rollout/tail/process.py); the tail below the others only there, never beside the
            # engine it must keep fed
            background = placement.background(cores, f"rollout-{i}", usable)
            self._spawn(
                f"rollout-{i}",
                service_command(
                    "rollout",
                    {
                        "model": s.model,
                        "bind": self.rollout_address(i),
                        "redis_url": self.redis_url,
                        "reward_address": self.reward_address,
                        "namespace": s.namespace,
                        "engine.cpu_threads_bind": worker_cpu_bind(s.rollout_cpu_bind, i),
                        "background_cores": background,
                        "tail_nice": nice if background else 0,
                        **self._ports(f"rollout-{i}"),
                        **secure,
                        **s.rollout_overrides,
                    },
                ),
                cores[f"rollout-{i}"],
            )
        self._spawn(
            "learner",
            service_command(
                "learner",
                {
                    "bind": self.learner_address,
                    "redis_url": self.redis_url,
                    "runs_dir": str(s.workdir / "runs"),
                    "namespace": s.namespace,
                    "read_roots": json.dumps(read_roots(s)),
                    "borrow_cores": placement.borrowable(cores, learner),
                    **self._ports("learner"),
                    **secure,
                    **s.learner_overrides,
                },
            ),
            cores["learner"],
        )
        self.wait_ready()
        scrape_targets.write_file_sd(s.workdir / scrape_targets.FILE_SD, self.metrics_urls())

    def wait_ready(self, timeout: float = 420.0) -> None:
        deadline = time.monotonic() + timeout
        targets = [("reward", self.reward_address), ("learner", self.learner_address)]
        if self.spec.environment:
            targets.append(("env", self.env_address))
        targets += [
            (f"rollout-{i}", self.rollout_address(i)) for i in range(self.spec.rollout_workers)
        ]
        for name, address in targets:
            while True:
                self.check_alive()
                try:
                    wait_serving(
                        address,
                        timeout=min(5.0, max(deadline - time.monotonic(), 0.1)),
                        security=self.spec.security,
                    )
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"{name} at {address} not ready after {timeout:.0f}s; "
                            f"see {self.logs}/{name}.log"
                        )

    def check_alive(self) -> None:
        for p in self.procs:
            code = p.popen.poll()
            if code is not None:
                tail = p.log_path.read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(
                    f"{p.name} (pid {p.popen.pid}) exited with code {code}; last log lines:\n"
                    + "\n".join(tail)
                )

    def stop(self, grace: float = 10.0) -> None:
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                try:
                    os.kill(p.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in reversed(self.procs):
            try:
                p.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                # vLLM's engine processes are children of the service: end the whole group.
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
            log.info("stopped %s (pid %d)", p.name, p.popen.pid)
        # Anything the services left behind in their process groups (vLLM engine cores).
        for p in self.procs:
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.procs.clear()


def worker_cpu_bind(mode: str, index: int) -> str:
    """The engine ``cpu_threads_bind`` of rollout worker ``index``: ``spread`` pins worker i to
    the i-th core this process may use (round robin); any other value (``auto``, ``nobind``, a
    core list) is passed to every worker as is. vLLM's ``auto`` pins the engine processes of a
    2-core machine to core 0 (it keeps the last core for its scheduler); an engine in the
    worker's own process (the default) is pinned by the launcher instead (placement.py).
    """
    if mode != "spread":
        return mode
    (core,) = placement.worker_cores(mode, index, sorted(os.sched_getaffinity(0)))
    return str(core)


def read_roots(spec: ClusterSpec) -> list[str]:
    """The learner's read_roots: its working directory (the repository, .cache among it), the
    workdir, the model and the spec's extra roots, as the user who named them meant them."""
    return [".", *(str(Path(p).absolute()) for p in (spec.workdir, spec.model, *spec.read_roots))]


def security_overrides(security: SecurityConfig | None) -> dict[str, str]:
    """``security`` as the ``key=value`` overrides of a service (what differs from no security)."""

    def flat(tree: dict, prefix: str):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", str(value)

    return dict(flat(security.model_dump(exclude_defaults=True), "security.")) if security else {}


def child_env(threads: int = 0) -> dict:
    """The environment of a service process: the repo importable, unbuffered logs, and a thread
    cap when several services share the cores."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env
