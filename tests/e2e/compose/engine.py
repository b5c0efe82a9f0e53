"""A Docker engine of the test's own: installed from Debian's packages when missing, started as
`dockerd` with a persistent data root (image layers stay cached between runs), stopped by its pid,
and what it leaves behind removed (iptables chains, the docker0 bridge, the netns mount).

An engine that was already running is used as it is and left running: only what this module
started is stopped and cleaned up.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DATA_ROOT = Path(os.environ.get("BRORL_DOCKER_DATA_ROOT", "/var/lib/brorl-docker"))
PACKAGES = {"dockerd": "docker.io", "mmdebstrap": "mmdebstrap"}
# Compose v2 (the file uses `name:` and `bind.create_host_path`, which Debian 12's compose v1
# rejects): the CLI plugin from Debian 13's docker-compose package, kept beside the data root.
# DOCKER_CONFIG points the docker CLI at it; a `docker compose` already installed is used as is.
CLI_CONFIG = DATA_ROOT.parent / "brorl-docker-cli"
COMPOSE_SUITE = "trixie"
# Mount points dockerd makes: the netns files of containers under /run/docker/netns and a
# private bind mount of its data root.
MOUNT_PREFIXES = ("/run/docker", str(DATA_ROOT))
# The chains dockerd 20.10 creates (filter and nat tables); FORWARD's policy it sets to DROP.
DOCKER_CHAINS = {
    "filter": ["DOCKER", "DOCKER-ISOLATION-STAGE-1", "DOCKER-ISOLATION-STAGE-2", "DOCKER-USER"],
    "nat": ["DOCKER"],
}


class EngineError(RuntimeError):
    """The engine could not be installed, started or stopped; the message says what to do."""


def sh(*argv: str, check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run a command, capturing its output; a failure raises with the command and its stderr."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        raise EngineError(f"`{' '.join(argv)}` exited {proc.returncode}:\n{tail}")
    return proc


def ensure_packages() -> list[str]:
    """Install what is missing of docker.io and mmdebstrap (root); the names installed."""
    missing = [pkg for tool, pkg in PACKAGES.items() if shutil.which(tool) is None]
    if not missing:
        return []
    if os.geteuid() != 0:
        raise EngineError(f"not root: install {' '.join(missing)} (apt-get install) and rerun")
    sh("apt-get", "update", "-qq", timeout=300)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh("apt-get", "install", "-y", "-qq", *missing, env=env, timeout=600)
    return missing


@functools.cache
def compose_env() -> dict[str, str]:
    """Environment under which `docker compose` (v2) runs; installs the plugin if missing."""
    if sh("docker", "compose", "version", check=False).returncode == 0:
        return {}
    plugin = CLI_CONFIG / "cli-plugins" / "docker-compose"
    if not plugin.exists():
        _fetch_compose_plugin(plugin)
    return {"DOCKER_CONFIG": str(CLI_CONFIG)}


def _fetch_compose_plugin(plugin: Path) -> None:
    """apt-get download of the newer suite's docker-compose package with a private sources list
    (the host's apt configuration is not touched), unpacked with dpkg-deb."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "lists" / "partial").mkdir(parents=True)
        (root / "sources.list").write_text(
            f"deb http://deb.debian.org/debian {COMPOSE_SUITE} main\n"
        )
        opts = [
            f"-oDir::Etc::SourceList={root / 'sources.list'}",
            "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={root / 'lists'}",
            "-oAPT::Sandbox::User=root",
        ]
        sh("apt-get", *opts, "update", "-qq", timeout=300)
        sh("apt-get", *opts, "download", "docker-compose", cwd=tmp, timeout=300)
        [deb] = root.glob("docker-compose_*.deb")
        sh("dpkg-deb", "-x", str(deb), str(root / "x"))
        plugin.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / "x/usr/libexec/docker/cli-plugins/docker-compose", plugin)


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return (
        sh("docker", "info", "--format", "{{.ServerVersion}}", check=False, timeout=20).returncode
        == 0
    )


def _iptables_chains(table: str) -> set[str]:
    out = sh("iptables", "-t", table, "-S", check=False).stdout
    return {line.split()[1] for line in out.splitlines() if line.startswith("-N ")}


def _docker_rules(table: str) -> set[str]:
    """The table's rules that name a Docker chain or a Docker bridge (docker0, br-<id>)."""
    out = sh("iptables", "-t", table, "-S", check=False).stdout
    mark = re.compile(r"(-j|-N|-A) DOCKER|docker0|\bbr-[0-9a-f]{12}\b")
    return {line for line in out.splitlines() if line.startswith("-A ") and mark.search(line)}


def _forward_policy() -> str:
    for line in sh("iptables", "-S", "FORWARD", check=False).stdout.splitlines():
        if line.startswith("-P FORWARD"):
            return line.split()[2]
    return "ACCEPT"


@dataclass
class NetState:
    """The host's network state dockerd touches: what was there before it started."""

    chains: dict[str, set[str]] = field(default_factory=dict)
    rules: dict[str, set[str]] = field(default_factory=dict)
    forward_policy: str = "ACCEPT"
    bridges: set[str] = field(default_factory=set)  # docker0 and compose's br-<id>
    mounts: set[str] = field(default_factory=set)

    @classmethod
    def read(cls) -> "NetState":
        return cls(
            chains={t: _iptables_chains(t) for t in DOCKER_CHAINS},
            rules={t: _docker_rules(t) for t in DOCKER_CHAINS},
            forward_policy=_forward_policy(),
            bridges={
                n for n in os.listdir("/sys/class/net") if n == "docker0" or n.startswith("br-")
            },
            mounts=_mounts(),
        )


def _mounts() -> set[str]:
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return {p for p in points if p.startswith(MOUNT_PREFIXES)}


@dataclass
class Engine:
    """dockerd for the tests: `start()` (or reuse a running one), `stop()` by pid + cleanup."""

    data_root: Path = DATA_ROOT
    log_path: Path = field(default_factory=lambda: DATA_ROOT.parent / "brorl-dockerd.log")
    pid: int | None = None  # set when this module started dockerd
    before: NetState | None = None

    @property
    def owned(self) -> bool:
        return self.pid is not None

    def start(self, timeout: float = 60) -> "Engine":
        ensure_packages()
        if engine_answers():
            return self  # someone else's engine: used, never stopped here
        self.before = NetState.read()
        self.data_root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                ["dockerd", "--data-root", str(self.data_root), "--storage-driver=overlay2"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = proc.pid
        deadline = time.monotonic() + timeout
        while not engine_answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise EngineError(f"dockerd did not start (log {self.log_path}):\n{tail}")
            time.sleep(0.3)
        return self

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to our dockerd's pid (it stops its containers), SIGKILL after ``timeout``, then
        remove what it leaves behind. Nothing when the engine was not ours."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while _alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)
            while _alive(self.pid):
                time.sleep(0.1)
        self.pid = None
        clean_network(self.before or NetState())

    def leftovers(self) -> list[str]:
        """What this engine left that was not there before it started (empty: clean)."""
        before, now = self.before or NetState(), NetState.read()
        left = [
            f"iptables -t {t} chain {c}"
            for t in DOCKER_CHAINS
            for c in sorted(now.chains[t] - before.chains.get(t, set()))
        ]
        left += [
            f"iptables -t {t} rule {r}"
            for t in DOCKER_CHAINS
            for r in sorted(now.rules[t] - before.rules.get(t, set()))
        ]
        if now.forward_policy != before.forward_policy:
            left.append(f"iptables FORWARD policy {now.forward_policy}")
        left += [f"bridge {b}" for b in sorted(now.bridges - before.bridges)]
        left += [f"mount {m}" for m in sorted(now.mounts - before.mounts)]
        if any(_is_dockerd(p) for p in _pids()):
            left.append("a dockerd process")
        return left


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _is_dockerd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
    except OSError:
        return False


def clean_network(before: NetState) -> None:
    """Remove the chains, rules, bridges and mounts a stopped dockerd left, keeping what
    ``before`` had."""
    now = NetState.read()
    for table, chains in DOCKER_CHAINS.items():
        ours = [c for c in chains if c in now.chains[table] - before.chains.get(table, set())]
        for rule in sorted(now.rules[table] - before.rules.get(table, set())):
            words = rule.split()  # rules of the built-in chains; our chains go whole below
            if words[1] not in ours:
                sh("iptables", "-t", table, "-D", *words[1:], check=False)
        for chain in ours:
            sh("iptables", "-t", table, "-F", chain)
        for chain in ours:
            sh("iptables", "-t", table, "-X", chain)
    bridges = now.bridges - before.bridges
    if _forward_policy() != before.forward_policy:
        sh("iptables", "-P", "FORWARD", before.forward_policy, check=False)
    for bridge in sorted(bridges):
        sh("ip", "link", "delete", bridge, check=False)
    for point in sorted(now.mounts - before.mounts, key=len, reverse=True):  # deepest first
        sh("umount", "-l", point, check=False)
