"""``brorl cluster``: one command starts redis-server (when none answers), reward, rollout and
learner as separate processes, and stops every one of them by pid — on Ctrl-C, on SIGTERM, and
when one of the services dies."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
import redis

from brorl.apps.cluster.launcher import REPO_ROOT
from brorl.rpc import wait_serving
from tests.ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


class LaunchedCluster:
    def __init__(self, tmp, workers: int, model: str, extra: tuple[str, ...] = ()):
        self.redis_port, reward, learner, rollout = free_ports(4)  # nothing listens on redis_port
        self.addresses = {"reward": f"127.0.0.1:{reward}", "learner": f"127.0.0.1:{learner}"}
        self.addresses.update({f"rollout-{i}": f"127.0.0.1:{rollout + i}" for i in range(workers)})
        argv = [
            sys.executable,
            "-m",
            "brorl.apps.cli",
            "cluster",
            "--model",
            model,
            "--workers",
            str(workers),
            "--workdir",
            str(tmp / "cluster"),
            "--redis-url",
            f"redis://127.0.0.1:{self.redis_port}/0",
            "--reward-port",
            str(reward),
            "--learner-port",
            str(learner),
            "--rollout-base-port",
            str(rollout),
            "--namespace",
            tmp.name,
            *extra,
        ]
        self.popen = subprocess.Popen(
            argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.ready_line = self._wait_ready()
        self.metrics_line = self.popen.stdout.readline()  # printed right after the ready line
        # The services and everything they started (vLLM engine processes), found by pid.
        self.pids = {}
        for part in self.ready_line.split("pids: ")[1].split("; logs")[0].split(", "):
            name, pid = part.rsplit(" ", 1)
            self.pids[name] = int(pid)
        self.descendants = [
            c.pid
            for pid in self.pids.values()
            for c in psutil.Process(pid).children(recursive=True)
        ]

    def _wait_ready(self, timeout: float = 420) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if line.startswith("cluster ready"):
                return line
            if not line and self.popen.poll() is not None:
                raise AssertionError(
                    f"cluster exited {self.popen.returncode}: {self.popen.stderr.read()}"
                )
        raise AssertionError("cluster not ready in time")

    def all_pids(self) -> list[int]:
        return list(self.pids.values()) + self.descendants

    def finish(self, timeout: float = 90) -> tuple[int, str]:
        out, err = self.popen.communicate(timeout=timeout)
        return self.popen.returncode, out + err


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def redis_answers(port: int) -> bool:
    try:
        return redis.Redis(port=port, socket_connect_timeout=0.5).ping()
    except redis.RedisError:
        return False


def test_ctrl_c_stops_every_process_including_vllm_engines(tmp_path, tiny_model):
    # vLLM in its own processes (not the default): Ctrl-C must reach the engines' processes too
    c = LaunchedCluster(
        tmp_path, workers=1, model=tiny_model, extra=("--rollout-set", "engine.in_process=false")
    )
    try:
        assert set(c.pids) == {
            "redis",
            "reward",
            "rollout-0",
            "learner",
        }  # redis started: none answered
        assert redis_answers(c.redis_port)
        for address in c.addresses.values():
            wait_serving(address, timeout=10)
        assert all(alive(pid) for pid in c.all_pids())
        assert c.descendants, "the rollout service runs its vLLM engine in a child process"
        # no --threads-per-process: the cores split between the worker and the learner
        even = str(max(1, len(os.sched_getaffinity(0)) // 2))
        for name in ("reward", "rollout-0", "learner"):
            assert psutil.Process(c.pids[name]).environ().get("OMP_NUM_THREADS") == even, name
        # every service's /metrics, printed and listed for Prometheus (docs/observability.md)
        urls = dict(
            part.split(" ")
            for part in c.metrics_line.split("metrics: ")[1].split(" (")[0].split(", ")
        )
        assert set(urls) == {"reward", "rollout-0", "learner"}, c.metrics_line
        for url in urls.values():
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert b"brorl_rpc_requests_total" in resp.read()
        targets = json.loads((tmp_path / "cluster" / "prometheus_targets.json").read_text())
        assert sorted(t["labels"]["name"] for t in targets) == ["learner", "reward", "rollout-0"]
    finally:
        c.popen.send_signal(signal.SIGINT)
        code, output = c.finish()
    assert code == 0, output
    assert "stopping" in output
    assert not [pid for pid in c.all_pids() if alive(pid)]
    assert not redis_answers(c.redis_port)


def test_sigterm_and_a_dying_service_stop_the_cluster(tmp_path, tiny_model):
    c = LaunchedCluster(tmp_path / "term", workers=0, model=tiny_model)
    c.popen.send_signal(signal.SIGTERM)
    code, _ = c.finish()
    assert code == 0  # SIGTERM is handled like Ctrl-C
    assert not [pid for pid in c.all_pids() if alive(pid)]

    c = LaunchedCluster(tmp_path / "dies", workers=0, model=tiny_model)
    psutil.Process(c.pids["reward"]).kill()
    code, output = c.finish()
    assert code == 1
    assert "reward" in output and "exited" in output and "Traceback" not in output
    assert not [pid for pid in c.all_pids() if alive(pid)]


def test_two_learner_ranks_train_and_a_killed_rank_fails_the_run_with_its_name(
    tmp_path, tiny_model
):
    """``brorl cluster --learner-ranks 2``: the learner starts rank 1 as its child; a run trains
    through both; killing rank 1 mid-run fails the run with a message naming it within 60 s."""
    from brorl.client import LearnerClient
    from demo.task import problems

    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
            for p in problems(100, seed=3)
        )
    )

    def config(steps):
        return f"""
model: {tiny_model}
data: {{train_path: {data}}}
reward_fn: format
sampling: {{n: 32, temperature: 1.0, top_k: -1, top_p: 1.0, max_tokens: 6}}
train: {{steps: {steps}, groups_per_step: 2, micro_batch_paths: 16}}
checkpoint_every: 0
"""

    c = LaunchedCluster(
        tmp_path,
        workers=1,
        model=tiny_model,
        extra=("--learner-ranks", "2", "--read-root", str(tmp_path)),
    )
    try:
        [rank1] = psutil.Process(c.pids["learner"]).children()
        client = LearnerClient(c.addresses["learner"])
        info = client.start(config(3), run_id="two-ranks")
        list(client.watch(info.run_id, timeout=300))
        final = client.get(info.run_id)
        assert (final.state, final.step, final.weight_version) == ("finished", 3, 3), final.message

        info = client.start(config(200), run_id="rank-killed")
        deadline = time.monotonic() + 300
        while client.get(info.run_id).step < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        killed = time.monotonic()
        rank1.kill()
        while client.get(info.run_id).state == "running" and time.monotonic() - killed < 90:
            time.sleep(0.5)
        final, waited = client.get(info.run_id), time.monotonic() - killed
        assert final.state == "failed", final
        assert f"learner rank 1 (pid {rank1.pid}) exited with code -9" in final.message
        assert waited < 60, waited
        # the learner itself keeps serving, and says why it takes no new run
        with pytest.raises(Exception, match="restart the learner"):
            client.start(config(3), run_id="after")
    finally:
        c.popen.send_signal(signal.SIGINT)
        code, output = c.finish()
    assert code == 0, output
    assert not [pid for pid in c.all_pids() if alive(pid)]
