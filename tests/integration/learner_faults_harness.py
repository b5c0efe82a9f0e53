"""What the learner fault tests share: a private redis-server (AOF on, stopped by pid), a
rollout stand-in that answers prompt jobs through the real Redis channels, and a learner run
(the real Trainer with a policy that records what it trained and checkpoints as JSON) that
can run in this process or in a child process to be SIGKILLed.

    python -m tests.integration.learner_faults_harness REDIS_URL RUN_ID RUN_DIR STEPS [--resume]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import redis

from brorl import queue as q
from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from tests.ports import free_ports

REPO = Path(__file__).resolve().parents[2]


class PrivateRedis:
    """A redis-server of the test's own on a free port, persisting to an append-only file."""

    def __init__(self, workdir: Path):
        self.dir, self.port = workdir, free_ports(1)[0]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "PrivateRedis":
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.5).ping()
                return self
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # by pid; SIGTERM flushes the AOF
            self.proc.wait(timeout=10)


def answer_job(job: common_pb2.PromptJob, version: int) -> common_pb2.PathGroup:
    """A scored group for ``job``: rewards alternate 1, 0 so that every group has signal."""
    group = common_pb2.PathGroup(
        run_id=job.run_id,
        group_id=job.group_id,
        prompt_id=job.prompt_id,
        prompt_token_ids=[3, 4],
        weight_version=version,
        part_index=job.part_index,
        part_count=job.part_count,
        generated=job.sampling.n,
    )
    for i in range(job.sampling.n):
        group.paths.add(
            path_id=f"{job.group_id}/{job.path_offset + i}",
            group_id=job.group_id,
            token_ids=[5, 6],
            logprobs=[-0.5, -0.5],
            reward=float(i % 2),
            reward_status="ok",
            weight_version=version,
            worker="fake",
        )
    return group


class FakeRollout(threading.Thread):
    """Answers the run's prompt jobs like a rollout worker (publish once + ack), and keeps
    going through Redis outages as the real worker loop does."""

    def __init__(self, url: str, run_id: str):
        super().__init__(daemon=True)
        self.url, self.run_id, self.stop = url, run_id, threading.Event()
        self.job_ids: list[str] = []  # every job answered

    def run(self) -> None:
        client = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=1)
        channels = q.RunChannels(client, self.run_id, namespace=self.run_id)
        queue = None
        while not self.stop.is_set():
            try:
                queue = queue or channels.prompt_queue(consumer="fake", claim_idle_ms=2000)
                for d in queue.read(count=4, block_ms=200):
                    job = common_pb2.PromptJob.FromString(d.data)
                    pointer = channels.read_weights()
                    group = answer_job(job, pointer.version if pointer else 0)
                    channels.publish_group(queue, d.entry_id, job.job_id, group.SerializeToString())
                    self.job_ids.append(job.job_id)
            except (redis.ConnectionError, redis.TimeoutError):  # Redis restarting
                time.sleep(0.3)


class JsonCheckpointPolicy:
    """Records each update's group ids; checkpoints are JSON (client state + a 'latest' tag)."""

    def __init__(self):
        self.updates: list[list[str]] = []
        self.workers: set[str] = set()  # who sampled the paths trained on

    def warm_forward(self, paths: int, length: int) -> float:
        return 0.0

    def update(self, groups) -> dict[str, float]:
        self.updates.append([g.group_id for g in groups])
        self.workers.update(p.worker for g in groups for p in g.paths)
        time.sleep(0.05)  # an update takes some time: a kill can land anywhere
        return {
            "learner/loss": 0.0,
            "learner/nonzero_paths": float(sum(len(g.paths) for g in groups)),
        }

    def weights(self) -> dict[str, np.ndarray]:
        return {"w": np.zeros(4, dtype=np.float32)}

    def export(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        return out

    def save_checkpoint(self, directory: str, tag: str, client_state: dict) -> None:
        Path(directory, tag).mkdir(parents=True, exist_ok=True)
        tmp = Path(directory, tag, "client.json.tmp")
        tmp.write_text(json.dumps(client_state))
        tmp.replace(Path(directory, tag, "client.json"))
        Path(directory, "latest.tmp").write_text(tag)
        Path(directory, "latest.tmp").replace(Path(directory, "latest"))

    def load_checkpoint(self, directory: str) -> dict:
        tag = Path(directory, "latest").read_text()
        return json.loads(Path(directory, tag, "client.json").read_text())


def run_config(data: Path, steps: int, **asynchrony) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": str(data.parent),
            "data": {"train_path": str(data)},
            "sampling": {"n": 4},
            "train": {"steps": steps, "groups_per_step": 2},
            "async": {"max_inflight_groups": 4, "group_timeout_s": 60, **asynchrony},
            "checkpoint_every": 3,
        }
    )


def write_prompts(path: Path, count: int = 50) -> Path:
    path.write_text(
        "".join(
            json.dumps({"prompt": f"{i}+1=", "reference": str(i + 1)}) + "\n" for i in range(count)
        )
    )
    return path


def run_learner(
    url: str, run_id: str, run_dir: Path, steps: int, resume: bool = False, **asynchrony
) -> JsonCheckpointPolicy:
    from brorl.weights.store import WeightStore
    from services.learner.observe.runstate import RunState
    from services.learner.train import Trainer

    run_dir.mkdir(parents=True, exist_ok=True)
    data = write_prompts(run_dir / "train.jsonl") if not resume else run_dir / "train.jsonl"
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=1)
    policy = JsonCheckpointPolicy()
    trainer = Trainer(
        run_id,
        run_config(data, steps, **asynchrony),
        RunState(run_id, run_dir, steps),
        q.RunChannels(client, run_id, namespace=run_id),
        q.RunRegistry(client, run_id),  # a namespace of its own: the run's id
        WeightStore(run_dir / "weights"),
        lambda: policy,
        resume=resume,
    )
    trainer.run()
    return policy


def trained_steps(run_dir: Path) -> dict[int, list[str]]:
    """Step → group ids of the update that counts: a step repeated after a crash replaces the
    lost one (the resumed weights never saw it)."""
    steps: dict[int, list[str]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "groups" in m:
            steps[m["step"]] = m["groups"]
    return steps


if __name__ == "__main__":
    url, run_id, run_dir, steps = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    run_learner(url, run_id, run_dir, steps, resume="--resume" in sys.argv)
