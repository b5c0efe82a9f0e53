"""``brorl cluster``: one command starts redis-server (when none answers), reward, rollout and
learner as separate processes, and stops every one of them by pid — on Ctrl-C, on SIGTERM, and
when one of the services dies."""

import json
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
import redis

from brorl.apps.launcher import REPO_ROOT
from brorl.rpc import wait_serving
from tests.ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


class LaunchedCluster:
    def __init__(self, tmp, workers: int, model: str):
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
    c = LaunchedCluster(tmp_path, workers=1, model=tiny_model)
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
