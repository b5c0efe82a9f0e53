"""What the compose test does to a running cluster: a tiny model and data on the host, a run
started through the learner's published port and followed, a rollout container killed while it
holds a job, and the proof that the job was re-sent and published once (the done set of the
publish-once script, brorl/streams.py) and trained once (the learner's seen groups)."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis

from brorl import queue as q
from brorl.client import LearnerClient
from brorl.contract import ConsumerGroup
from brorl.v1 import common_pb2
from tests.e2e.compose.cluster import NAMESPACE, Compose, service_of
from tests.e2e.compose.engine import sh

RUN_CONFIG = """\
model: /model
data: {train_path: /datasets/train.jsonl}
reward_fn: format
sampling: {n: 128, temperature: 1.0, top_k: -1, top_p: 1.0, max_tokens: 6}
train: {steps: %(steps)d, groups_per_step: 2, lr: 0.001, micro_batch_paths: 256}
async: {max_staleness: 2, publish_every: 1, max_inflight_groups: 4}
checkpoint_every: 1000
"""


def make_inputs(root: Path) -> tuple[Path, Path]:
    """The tiny demo model (created, never downloaded) and 2-digit addition prompts, readable by
    the containers' brorl user; (model dir, datasets dir)."""
    from demo.model import create_tiny_model
    from demo.task import problems

    model = create_tiny_model(root / "model", seed=0)
    datasets = root / "datasets"
    datasets.mkdir(exist_ok=True)
    (datasets / "train.jsonl").write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
            for p in problems(200, seed=5)
        )
    )
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return Path(model), datasets


@dataclass
class Run:
    """A run on the compose learner, its metrics collected by a WatchRun thread."""

    client: LearnerClient
    run_id: str
    steps: list[dict] = field(default_factory=list)  # one values dict per step (+ "step")
    ended: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, address: str, run_id: str, steps: int) -> "Run":
        client = LearnerClient(address)
        client.start(RUN_CONFIG % {"steps": steps}, run_id=run_id)
        run = cls(client, run_id)
        threading.Thread(target=run._follow, daemon=True).start()
        return run

    def _follow(self) -> None:
        try:
            for m in self.client.watch(self.run_id, timeout=900):
                self.steps.append({"step": m.step, **dict(m.values)})
        except grpc.RpcError:  # the learner went away (down, or a failed test's teardown)
            pass
        finally:
            self.ended.set()

    @property
    def step(self) -> int:
        return self.steps[-1]["step"] if self.steps else 0

    def wait(self, what: str, ok, timeout: float = 300) -> dict:
        """Block until ``ok(last step's values)``; the values. A run that ends first or a
        timeout raises with the run's state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.steps and ok(self.steps[-1]):
                return self.steps[-1]
            if self.ended.is_set():
                break
            time.sleep(0.3)
        info = self.client.get(self.run_id)
        raise AssertionError(
            f"waiting for {what}: run {info.state} at step {self.step}: {info.message}"
        )


def workers_of(values: dict) -> set[str]:
    """The rollout workers (host name-pid) whose paths a step trained on."""
    return {
        k.split("/", 2)[2] for k, v in values.items() if k.startswith("rollout/paths_by/") and v > 0
    }


def worker_weight_version(container_id: str) -> int:
    """The weight version a rollout container's engine holds, from its own /metrics."""
    code = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9461/metrics').read().decode())"
    text = sh("docker", "exec", container_id, "python", "-c", code).stdout
    match = re.search(r"^brorl_rollout_weight_version\{[^}]*\} ([0-9.e+]+)$", text, flags=re.M)
    assert match, f"no brorl_rollout_weight_version in {container_id[:12]}'s /metrics"
    return int(float(match.group(1)))


@dataclass
class Kill:
    victim: str  # container id
    consumer: str  # its Redis consumer name (host name-pid)
    jobs: dict[str, str]  # stream entry id -> job id, in flight when it was killed
    groups: dict[str, str]  # job id -> group id
    checked_ms: int  # Redis's clock when the held jobs were read (the victim frozen and quiet)
    addresses: frozenset[str]  # its IPs, as Redis names its clients (audit.Publish.address)


# A publish the worker wrote to its socket before it froze still reaches Redis: the kernel sends
# it, not the frozen process, and under load TCP may retransmit part of it later. So what the
# frozen worker holds is read once Redis has heard nothing on any of its connections for a while
# with no command half-read (its subscriptions aside: a subscribed connection cannot publish,
# and announcements written to it count as activity).
QUIET_S = 1  # CLIENT LIST's idle is in whole seconds
QUIET_TIMEOUT_S = 30.0


def kill_worker_holding_a_job(compose: Compose, redis_url: str, run_id: str, timeout=120) -> Kill:
    """SIGKILL a rollout container while it holds an unpublished job; the jobs it held.

    A job takes a fraction of a second, less than a `docker kill` on a loaded machine, so the
    container is frozen first (`docker pause`): frozen, it cannot publish, and what it holds
    once Redis has read all it sent is what it holds when it dies (Compose.kill signals its
    processes before they thaw). One whose jobs were
    published meanwhile is thawed and the next held job is tried, as is one the freezer could
    not freeze."""
    r, keys = q.connect(redis_url), q.keys(run_id, namespace=NAMESPACE)
    running = [c for c in compose.containers("rollout") if c["State"]["Running"]]
    hosts = {c["Config"]["Hostname"]: c for c in running}
    deadline, unfrozen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        held = [
            p
            for p in r.xpending_range(keys["prompts"], ConsumerGroup.ROLLOUT, "-", "+", 100)
            if p["consumer"].decode().rsplit("-", 1)[0] in hosts
        ]
        if not held:
            time.sleep(0.02)
            continue
        consumer = held[0]["consumer"].decode()
        victim = hosts[consumer.rsplit("-", 1)[0]]
        if not compose.pause(victim["Id"]):  # the freezer gave up on a busy container: retry
            unfrozen += 1
            time.sleep(0.2)
            continue
        addresses = _addresses(victim)
        _wait_quiet(r, addresses)
        jobs, groups = _unpublished(r, keys["prompts"], consumer)
        if jobs:
            checked_ms = _now_ms(r)
            compose.kill(victim["Id"])
            return Kill(victim["Id"], consumer, jobs, groups, checked_ms, frozenset(addresses))
        compose.unpause(victim["Id"])
    raise AssertionError(
        f"no rollout container held an unpublished job in {timeout}s "
        f"({unfrozen} pauses refused by the cgroup freezer)"
    )


def _now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def _unpublished(r: redis.Redis, stream: str, consumer: str) -> tuple[dict, dict]:
    """The entries pending on ``consumer`` that are still in the stream (a publish deletes its
    job's entry): (entry id -> job id, job id -> group id)."""
    jobs, groups = {}, {}
    for p in r.xpending_range(stream, ConsumerGroup.ROLLOUT, "-", "+", 100):
        entry = p["message_id"].decode()
        found = r.xrange(stream, entry, entry)
        if p["consumer"].decode() == consumer and found:
            job = common_pb2.PromptJob.FromString(found[0][1][b"data"])
            jobs[entry], groups[job.job_id] = job.job_id, job.group_id
    return jobs, groups


def _addresses(container: dict) -> set[str]:
    """The container's IP addresses on its networks (how Redis's CLIENT LIST names it)."""
    networks = container["NetworkSettings"]["Networks"].values()
    return {n["IPAddress"] for n in networks if n.get("IPAddress")}


def _wait_quiet(r: redis.Redis, addresses: set[str]) -> None:
    """Until every connection from ``addresses`` that is not a subscriber has been idle for
    QUIET_S with nothing half-read in its query buffer."""
    deadline, busy = time.monotonic() + QUIET_TIMEOUT_S, []
    while time.monotonic() < deadline:
        busy = [
            c
            for c in r.client_list()
            if c["addr"].rsplit(":", 1)[0] in addresses
            and int(c["sub"]) + int(c["psub"]) == 0
            and (int(c["idle"]) < QUIET_S or int(c["qbuf"]) > 0)
        ]
        if not busy:
            return
        time.sleep(0.1)
    raise AssertionError(f"the frozen container's connections did not go quiet: {busy}")


def wait_resent_once(compose: Compose, run: Run, kill: Kill, timeout: float = 180) -> None:
    """Every job the dead worker held is published exactly once (its id enters the done set of
    the publish-once script, which publishes a job id's group only on its first entry) and is no
    longer pending anywhere. A timeout raises with what the cluster was doing."""
    r, keys = q.connect(compose.redis_url), q.keys(run.run_id, namespace=NAMESPACE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [j for j in kill.jobs.values() if r.zscore(keys["done"], j) is not None]
        left = [e for e in kill.jobs if r.xrange(keys["prompts"], e, e)]
        if len(done) == len(kill.jobs) and not left:
            return
        time.sleep(0.3)
    raise AssertionError(
        f"jobs of the killed worker not re-sent in {timeout}s: {kill.jobs}\n"
        + cluster_state(compose, run, r, keys)
    )


def cluster_state(compose: Compose, run: Run, r: redis.Redis, keys: dict[str, str]) -> str:
    """The run's state, the prompt stream's pending entries and consumers, every container's
    state and the rollout and learner containers' last log lines: for a failure message."""
    info = run.client.get(run.run_id)
    pending = r.xpending_range(keys["prompts"], ConsumerGroup.ROLLOUT, "-", "+", 50)
    consumers = r.xinfo_consumers(keys["prompts"], ConsumerGroup.ROLLOUT)
    dead = q.RunChannels(r, run.run_id, namespace=NAMESPACE).read_dead()[1]
    lines = [
        f"run {info.state} at step {run.step}: {info.message}",
        "pending: "
        + "; ".join(
            f"{p['message_id'].decode()} on {p['consumer'].decode()} idle "
            f"{p['time_since_delivered'] / 1000:.0f}s x{p['times_delivered']}"
            for p in pending
        ),
        "consumers: "
        + "; ".join(
            f"{c['name'].decode()} pending {c['pending']} idle {c['idle'] / 1000:.0f}s"
            for c in consumers
        ),
        "dead letters: " + "; ".join(f"{d.source}: {d.reason}" for d in dead),
    ]
    containers = compose.containers()
    for c in containers:
        s = c["State"]
        lines.append(
            f"{c['Name'].lstrip('/')}: {s['Status']} restarts {c['RestartCount']} "
            f"pid {s['Pid']} host {c['Config']['Hostname']}"
        )
    logged = [c for c in containers if service_of(c) in ("rollout", "learner")]
    return "\n".join(lines) + "\n" + compose.logs_of(logged, lines=40)
