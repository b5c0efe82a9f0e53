"""The whole loop as separate processes: reward + two rollout workers + learner over gRPC and
Redis; the run publishes weight versions the workers load, both workers contribute paths,
the run directory holds config, metrics and final HF weights, and a run resumes from its
checkpoint."""
import json
import uuid

import pytest

from brorl.client import LearnerClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def run_config(model, data, steps):
    return f"""
model: {model}
data: {{train_path: {data}}}
reward_fn: format
sampling: {{n: 64, temperature: 1.0, max_tokens: 6}}
train: {{steps: {steps}, groups_per_step: 2, lr: 0.001, micro_batch_paths: 64}}
async: {{max_staleness: 2, publish_every: 1, max_inflight_groups: 4}}
checkpoint_every: 3
"""


def follow(client, run_id):
    metrics = [m for m in client.watch(run_id, timeout=600)]
    return metrics, client.get(run_id)


def test_pipeline_two_workers_publish_checkpoint_resume(services, tiny_model, tmp_path):
    from demo.task import problems
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n" for p in problems(200, seed=5)))
    reward = services("reward").wait_serving()
    for i in range(2):
        services("rollout", name=f"rollout{i}", model=tiny_model, reward_address=reward.address, claim_idle_ms=5000)
    learner = services("learner", runs_dir=str(tmp_path / "runs")).wait_serving()
    client = LearnerClient(learner.address)

    run_id = f"e2e-{uuid.uuid4().hex[:6]}"
    info = client.start(run_config(tiny_model, data, steps=6), run_id=run_id)
    metrics, final = follow(client, info.run_id)
    assert final.state == "finished", final.message
    assert final.step == 6 and final.weight_version == 6

    last = [m for m in metrics if "learner/loss" in m.values][-1].values
    by_worker = {k: v for k, v in last.items() if k.startswith("rollout/paths_by/")}
    assert len(by_worker) == 2 and all(v > 0 for v in by_worker.values()), by_worker
    # workers reloaded published weights: some consumed groups were sampled by version >= 1
    assert max(m.values.get("rollout/staleness", 0) for m in metrics) <= 2
    assert any(m.values.get("learner/weight_version", 0) >= 1 and m.values.get("learner/staleness_mean", 9) < 9 for m in metrics)

    run_dir = tmp_path / "runs" / run_id
    assert (run_dir / "config.yaml").read_text().startswith("model:")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for line in lines if "learner/loss" in line) == 6
    assert {p.name for p in (run_dir / "final").iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}

    resumed = client.start(run_config(tiny_model, data, steps=8), run_id=run_id, resume=True)
    metrics, final = follow(client, resumed.run_id)
    assert final.state == "finished", final.message
    steps = [m.step for m in metrics if "learner/loss" in m.values]
    assert steps == [7, 8]                       # continued after the step-6 checkpoint
    assert final.weight_version == 6 + 1 + 2     # restored weights republished, then one per step
