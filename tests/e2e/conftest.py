import json
import subprocess
import sys
import uuid

import pytest

from brorl.apps.launcher import REPO_ROOT, ServiceProc, stop_all


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from demo.model import create_tiny_model

    return str(create_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0))


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory, tiny_model):
    """Reward, two rollout workers and a learner as separate processes, shared by the contract
    and pipeline tests: a vLLM engine takes most of a minute to start on this machine."""
    tmp = tmp_path_factory.mktemp("cluster")
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"  # other clusters may share this Redis
    procs = {"reward": ServiceProc("reward", tmp)}
    procs["reward"].wait_serving()
    for i in range(2):
        procs[f"rollout{i}"] = ServiceProc(
            "rollout",
            tmp,
            name=f"rollout{i}",
            model=tiny_model,
            reward_address=procs["reward"].address,
            claim_idle_ms=5000,
            namespace=namespace,
            max_n=1024,
        )
    procs["learner"] = ServiceProc(
        "learner",
        tmp,
        runs_dir=str(tmp / "runs"),
        namespace=namespace,
        read_roots=json.dumps([str(tmp_path_factory.getbasetemp())]),  # the model and the data
    )
    try:
        for p in procs.values():
            p.wait_serving()
        yield {"procs": procs, "model": tiny_model, "tmp": tmp, "runs": tmp / "runs"}
    finally:
        stop_all(procs.values())


@pytest.fixture
def services(tmp_path):
    """Factory: services("reward", **overrides) starts a real process; all are stopped after the
    test."""
    started: list[ServiceProc] = []

    def start(service: str, name: str | None = None, **overrides) -> ServiceProc:
        proc = ServiceProc(service, tmp_path, name=name, **overrides)
        started.append(proc)
        return proc

    yield start
    stop_all(started)


@pytest.fixture
def recipe_command(tmp_path):
    """Factory: recipe_command(["sweep"], port, *overrides) runs ``brorl sweep --workdir
    <tmp>/work --base-port port overrides...`` to its end, keeps its output in
    ``<tmp>/stdout.txt`` and returns it; a non-zero exit fails the test with the output's tail."""

    def run(command: list[str], base_port: int, *args: str, timeout: float = 900) -> str:
        cmd = [sys.executable, "-m", "brorl.apps.cli", *command, "--workdir",
               str(tmp_path / "work"), "--base-port", str(base_port), *args]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        (tmp_path / "stdout.txt").write_text(proc.stdout)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    return run
