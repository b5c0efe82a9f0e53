"""Runs of multi-turn episodes through the real cluster (reward, rollout with vLLM, learner as
processes): three-turn episodes train with the policy's log-probs matching the sampler's on every
turn; episodes whose environment hangs or answers garbage end with env_timeout / env_error and
are left out while the run goes on; an environment killed and restarted mid-run loses only the
episodes in flight; and an environment written in Node.js from the .proto alone drives a run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid

import pytest

from brorl.apps.cluster.launcher import REPO_ROOT
from brorl.apps.cluster.service_proc import ServiceProc
from brorl.client import LearnerClient
from tests.e2e.envs import scripted_env
from tests.e2e.envs.conftest import episode_run_config, tool_data
from tests.ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


def run_to_end(cluster, config: str):
    client = LearnerClient(cluster["procs"]["learner"].address)
    run_id = f"env-{uuid.uuid4().hex[:6]}"
    client.start(config, run_id=run_id)
    metrics = list(client.watch(run_id, timeout=600))
    final = client.get(run_id)
    client.close()
    steps = [m.values for m in metrics if "learner/loss" in m.values]
    return final, steps


def test_three_turn_episodes_train_and_failed_episodes_are_left_out(env_cluster, tmp_path):
    server, address, servicer = scripted_env.start(hang={1}, garbage={2})
    try:
        data = tool_data(tmp_path / "data.jsonl")
        config = episode_run_config(env_cluster["model"], data, address, steps=3, n=8)
        final, steps = run_to_end(env_cluster, config)
    finally:
        scripted_env.stop(server, servicer)
    assert final.state == "finished", final.message
    last = steps[-1]
    # 2 of every 8 episodes fail on purpose; the other 6 run their three turns
    assert last["learner/excluded_paths/env_timeout"] >= 1
    assert last["learner/excluded_paths/env_error"] >= 1
    # each step's episode figures in the message: a policy that ends an episode with EOS, or a
    # Step over the 3 s timeout on a loaded machine, shortens episodes; which one shows here
    shape = [
        {k: s.get(k) for k in ("env/turns_mean", "env/failed_share", "env/step_ms")}
        for s in steps
    ]
    assert all(2.0 <= s["env/turns_mean"] <= 3.0 for s in steps), shape
    assert all(0.0 < s["env/token_share"] < 1.0 for s in steps)
    # token continuity: on a step whose paths the learner's own weights sampled, every turn's
    # log-probs match the sampler's to float error (a re-tokenized turn would be off by nats);
    # a stale step's gaps are the policy's drift, which differs from turn to turn
    fresh = [s for s in steps if s["learner/staleness_mean"] == 0.0]
    assert fresh, [s["learner/staleness_mean"] for s in steps]
    for s in fresh:
        gaps = [s[f"learner/logp_gap/turn{k}"] for k in (1, 2, 3)]
        assert max(gaps) <= 0.01, gaps
    assert last["learner/duplicate_groups"] == 0


def test_an_environment_restarted_mid_run_loses_only_its_episodes_in_flight(env_cluster, tmp_path):
    [port] = free_ports(1)
    env = ServiceProc("env", tmp_path, env="calculator", bind=f"127.0.0.1:{port}").wait_serving()
    data = tool_data(tmp_path / "data.jsonl")
    config = episode_run_config(env_cluster["model"], data, f"127.0.0.1:{port}", steps=8, n=8)
    client = LearnerClient(env_cluster["procs"]["learner"].address)
    run_id = f"restart-{uuid.uuid4().hex[:6]}"
    client.start(config, run_id=run_id)
    try:
        for m in client.watch(run_id, timeout=600):
            if m.values.get("learner/loss") is not None and m.step >= 2:
                break
        env.kill(signal.SIGKILL)  # episodes in flight now fail with env_error
        time.sleep(3)
        env = ServiceProc("env", tmp_path, name="env2", env="calculator", bind=f"127.0.0.1:{port}")
        env.wait_serving()
        metrics = list(client.watch(run_id, from_step=0, timeout=600))
        final = client.get(run_id)
    finally:
        env.stop()
        client.close()
    assert final.state == "finished" and final.step == 8, final.message
    steps = [m.values for m in metrics if "learner/loss" in m.values]
    assert steps[-1]["learner/excluded_paths/env_error"] >= 1
    assert steps[-1]["learner/duplicate_groups"] == 0


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_an_environment_written_in_node_drives_a_run(env_cluster, tmp_path):
    node_dir = REPO_ROOT / "examples" / "node"
    if not (node_dir / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("examples/node has no node_modules: run `bash scripts/setup.sh`")
    port_file = tmp_path / "node.port"
    log = open(tmp_path / "node.log", "wb")
    proc = subprocess.Popen(
        ["node", str(node_dir / "env_server.js"), "--port", "0", "--port-file", str(port_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = f"127.0.0.1:{port_file.read_text()}"
        data = tool_data(tmp_path / "data.jsonl")
        config = episode_run_config(env_cluster["model"], data, address, steps=2, n=8)
        final, steps = run_to_end(env_cluster, config)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        log.close()
    assert final.state == "finished", final.message
    assert steps and all(s["env/turns_mean"] >= 1.0 for s in steps)
    assert steps[-1].get("learner/excluded_paths/env_error", 0) == 0
