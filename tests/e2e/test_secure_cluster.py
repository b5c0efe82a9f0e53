"""A cluster with a token and TLS (docs/security.md), as separate processes (the learner alone:
test_secure_learner.py): the launcher passes the settings to every service, the rollout worker
scores through reward over TLS with the token,
a short run trains end to end, and the `brorl` CLI reaches the learner with --token-file and
--tls-ca — while callers without the token get UNAUTHENTICATED and callers without the CA do not
get in at all."""

import json
import subprocess
import sys
import uuid

import grpc
import pytest

from brorl.apps.cluster.launcher import REPO_ROOT, Cluster, ClusterSpec
from brorl.client import LearnerClient, RewardClient, RolloutClient
from brorl.config.base import validate
from brorl.security import SecurityConfig
from tests.certs import make_tls_files
from tests.ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


def settings(files, **keys) -> SecurityConfig:
    """A client's (or with tls cert/key, the cluster's) settings: TLS with the test CA."""
    return validate(SecurityConfig, keys | {"tls": {"ca": str(files.ca), **keys.get("tls", {})}})


def code_of(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_tls_cluster_runs_a_short_demo(tmp_path, tiny_model):
    from demo.task import problems

    tls = make_tls_files(tmp_path / "tls")
    spec_security = settings(
        tls, token_file=str(tls.token), tls={"cert": str(tls.cert), "key": str(tls.key)}
    )
    reward, learner, rollout = free_ports(3)
    work = tmp_path / "work"
    work.mkdir()
    data = work / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
            for p in problems(50, seed=3)
        )
    )
    spec = ClusterSpec(
        model=tiny_model,
        workdir=work,
        rollout_workers=1,
        reward_port=reward,
        learner_port=learner,
        rollout_base_port=rollout,
        namespace=f"tls-{uuid.uuid4().hex[:8]}",
        threads_per_process=1,
        security=spec_security,
    )
    client_security = settings(tls, token_file=str(tls.token))
    run_config = f"""
model: {tiny_model}
data: {{train_path: {data}}}
reward_fn: format
sampling: {{n: 16, temperature: 1.0, max_tokens: 6}}
train: {{steps: 2, groups_per_step: 1, lr: 0.001}}
async: {{max_staleness: 2, publish_every: 1, max_inflight_groups: 2}}
"""
    with Cluster(spec) as cluster:
        client = LearnerClient(cluster.learner_address, security=client_security)
        info = client.start(run_config, run_id="tls-run")
        list(client.watch(info.run_id, timeout=300))
        final = client.get(info.run_id)
        assert final.state == "finished", final.message
        assert final.step == 2 and final.weight_version >= 1

        # Every service refuses a caller without the token; the same call with it works.
        anonymous = settings(tls)
        rollout_address = cluster.rollout_address(0)
        assert code_of(
            lambda: RolloutClient(rollout_address, security=anonymous).generate("1+1=", n=1)
        ) == (grpc.StatusCode.UNAUTHENTICATED)
        assert code_of(lambda: RewardClient(cluster.reward_address, security=anonymous).list()) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert RewardClient(cluster.reward_address, security=client_security).list().functions

        cli = [sys.executable, "-m", "brorl.apps.cli", "run", "status", "tls-run"]
        cli += ["--learner", cluster.learner_address, "--tls-ca", str(tls.ca)]
        ok = subprocess.run(
            cli + ["--token-file", str(tls.token)], cwd=REPO_ROOT, capture_output=True, text=True
        )
        assert ok.returncode == 0 and json.loads(ok.stdout)["state"] == "finished", ok.stderr
        refused = subprocess.run(cli, cwd=REPO_ROOT, capture_output=True, text=True)
        assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
