import json
import uuid

import pytest

from brorl.apps.launcher import ServiceProc, stop_all


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
