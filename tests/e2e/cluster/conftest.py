"""The cluster the tests of this package share."""

import json
import uuid

import pytest

from brorl.apps.cluster.service_proc import ServiceProc, stop_all


@pytest.fixture(scope="package")
def shared_cluster(tmp_path_factory, tiny_model):
    """Reward, two rollout workers and a learner as separate processes, shared by every test of
    this package (a vLLM engine takes most of a minute to start on this machine) and stopped
    when the package's last test is done, so the other e2e tests run without it."""
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
        yield {
            "procs": procs,
            "model": tiny_model,
            "tmp": tmp,
            "runs": tmp / "runs",
            "namespace": namespace,
        }
    finally:
        stop_all(procs.values())
