"""A cluster for runs of multi-turn episodes (reward, one rollout worker, learner), shared by the
tests of this package; each test starts the environment it needs."""

import json
import uuid

import pytest

from brorl.apps.cluster.service_proc import ServiceProc, stop_all


@pytest.fixture(scope="package")
def tool_model(tmp_path_factory):
    """The tiny demo model with the tool-use task's characters ([ ] | ?), untrained."""
    from demo.model import create_tiny_model
    from demo.tooluse import CHARS

    return str(create_tiny_model(tmp_path_factory.mktemp("toolmodel") / "tiny", chars=CHARS))


@pytest.fixture(scope="package")
def env_cluster(tmp_path_factory, tool_model):
    tmp = tmp_path_factory.mktemp("envcluster")
    namespace = f"env-{uuid.uuid4().hex[:8]}"
    procs = {"reward": ServiceProc("reward", tmp)}
    procs["reward"].wait_serving()
    procs["rollout"] = ServiceProc(
        "rollout",
        tmp,
        model=tool_model,
        reward_address=procs["reward"].address,
        claim_idle_ms=5000,
        namespace=namespace,
    )
    procs["learner"] = ServiceProc(
        "learner",
        tmp,
        runs_dir=str(tmp / "runs"),
        namespace=namespace,
        read_roots=json.dumps([str(tmp_path_factory.getbasetemp())]),
    )
    try:
        for p in procs.values():
            p.wait_serving()
        yield {"procs": procs, "model": tool_model, "tmp": tmp, "runs": tmp / "runs"}
    finally:
        stop_all(procs.values())


def tool_data(path, n=64, seed=5) -> str:
    from demo.tooluse import problems

    path.write_text(
        "".join(json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
                for p in problems(n, seed))  # fmt: skip
    )
    return str(path)


def episode_run_config(model, data, env_address, steps=3, n=8, extra="") -> str:
    """A short run of episodes. The untrained model rarely earns the environment's reward, so
    the transcript's diversity (reward service) is added to it: every group has a spread of
    rewards to learn from (a group whose rewards are all equal is skipped)."""
    return f"""
model: {model}
data: {{train_path: {data}}}
reward_fn: diversity
env: {{address: "{env_address}", max_turns: 3, step_timeout_s: 3, episode_timeout_s: 60,
      reward: sum}}
sampling: {{n: {n}, temperature: 1.0, top_k: -1, top_p: 1.0, max_tokens: 8, stop: ["]"]}}
train: {{steps: {steps}, groups_per_step: 2, lr: 0.001, micro_batch_paths: 256}}
async: {{max_staleness: 2, publish_every: 1, max_inflight_groups: 4}}
checkpoint_every: 0
{extra}
"""
