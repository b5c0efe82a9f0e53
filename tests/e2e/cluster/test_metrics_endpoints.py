"""docs/observability.md's series, scraped over HTTP from every service of the live local cluster
(reward, two rollout workers, learner) while a short RL run trains and after it ends, plus the
run's TensorBoard event files."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from brorl.client import LearnerClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


def scrape(url: str) -> dict[str, list[tuple[dict, float]]]:
    """Sample name → [(labels, value)] of one /metrics answer."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def values(samples, name: str, **labels) -> list[float]:
    return [v for got, v in samples.get(name, []) if labels.items() <= got.items()]


def test_every_service_serves_the_named_series_during_a_run(shared_cluster, tmp_path):
    from demo.task import problems

    procs = shared_cluster["procs"]
    # Workers before the reward service: once every call's tail has run, the reward service's
    # count read last is at least the workers' (the wait for the last tail is below).
    urls = {name: procs[name].metrics_url for name in ("rollout0", "rollout1", "learner", "reward")}
    data = tmp_path / "train.jsonl"  # under the learner's read_roots (the session's basetemp)
    data.write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
            for p in problems(60, seed=11)
        )
    )
    config = f"""
model: {shared_cluster["model"]}
data: {{train_path: {data}}}
reward_fn: format
sampling: {{n: 64, temperature: 1.0, max_tokens: 6}}
train: {{steps: 4, groups_per_step: 2, lr: 0.001, micro_batch_paths: 256}}
async: {{max_staleness: 2, publish_every: 1, max_inflight_groups: 4}}
checkpoint_every: 0
samples_every: 2
"""
    # Counters are the cluster's since it started (other tests, Generate RPCs included): the
    # checks below are on what this run added.
    before = {name: scrape(url) for name, url in urls.items()}
    client = LearnerClient(procs["learner"].address)
    run_id = f"metrics-{uuid.uuid4().hex[:6]}"
    client.start(config, run_id=run_id)
    during = None
    for m in client.watch(run_id, timeout=600):
        if during is None and m.step >= 2 and "learner/loss" in m.values:
            during = {name: scrape(url) for name, url in urls.items()}  # the run still trains
    assert client.get(run_id).state == "finished"
    assert during is not None, "the run never reached step 2"
    after = {name: scrape(url) for name, url in urls.items()}

    # learner: step time breakdown, published version, reward, streams of the run in progress
    learner = during["learner"]
    for phase in ("wait", "update", "publish", "step", "forward", "backward", "optimizer"):
        assert values(learner, "brorl_learner_step_seconds", phase=phase), phase
        assert values(learner, "brorl_learner_step_seconds", phase=phase)[0] >= 0
    assert values(learner, "brorl_learner_weight_version")[0] >= 2
    assert values(learner, "brorl_learner_step")[0] >= 2
    assert values(learner, "brorl_learner_reward_mean")
    assert values(learner, "brorl_learner_metric", key="learner/loss")
    for series in ("brorl_queue_length", "brorl_queue_lag", "brorl_queue_pending"):
        for stream in ("prompts", "paths"):
            [depth] = values(learner, series, run=run_id, stream=stream)
            assert depth >= 0, (series, stream)
    assert values(after["learner"], "brorl_learner_weight_version") == [4.0]
    assert values(after["learner"], "brorl_learner_step") == [4.0]
    started = values(after["learner"], "brorl_rpc_requests_total", method="StartRun", code="OK")
    assert started and started[0] >= 1
    assert values(after["learner"], "brorl_rpc_latency_seconds_count", method="WatchRun")

    # rollout workers: counters (rate(): paths/s, tokens/s) and the version each one holds
    def added(service, name, **labels):
        now, then = values(after[service], name, **labels), values(before[service], name, **labels)
        return (now[0] if now else 0.0) - (then[0] if then else 0.0)

    def counted():
        return (
            sum(added(f"rollout{i}", "brorl_rollout_paths_total") for i in range(2)),
            sum(added(f"rollout{i}", "brorl_rollout_tokens_total") for i in range(2)),
            added("reward", "brorl_reward_scored_total", fn="format", status="ok"),
        )

    # A worker counts a call's paths when the engine returns them and scores them in the call's
    # tail, beside its next call: when the run ends, its last call may still be in its tail.
    deadline = time.monotonic() + 60
    while (count := counted())[2] < count[0] and time.monotonic() < deadline:
        time.sleep(0.2)
        after = {name: scrape(url) for name, url in urls.items()}
    paths, tokens, scored = counted()
    assert paths >= 4 * 2 * 64 and tokens >= paths
    versions = [values(after[f"rollout{i}"], "brorl_rollout_weight_version") for i in range(2)]
    assert all(len(v) == 1 for v in versions) and max(v[0] for v in versions) >= 1
    workers = {
        labels["worker"]
        for i in range(2)
        for labels, _ in after[f"rollout{i}"]["brorl_rollout_weight_version"]
    }
    assert len(workers) == 2  # labelled by worker
    checks = values(after["rollout0"], "brorl_rpc_requests_total", method="Check", code="OK")
    assert checks and checks[0] >= 1  # the fixture's health checks

    # reward service: scored paths by function and status, rewards, ScoreBatch latencies
    reward = after["reward"]
    assert scored >= paths  # each kept path scored once (or more when retried)
    [scored_total] = values(reward, "brorl_reward_scored_total", fn="format", status="ok")
    assert values(reward, "brorl_reward_value_count", fn="format")[0] == scored_total
    assert values(reward, "brorl_reward_score_count", fn="format")[0] == scored_total
    # one ScoreBatch per engine call, and a call holds one group of 64 paths or more
    calls = added("reward", "brorl_rpc_latency_seconds_count", method="ScoreBatch")
    assert 1 <= calls <= paths / 64
    assert added("reward", "brorl_rpc_requests_total", method="ScoreBatch", code="OK") == calls

    # the run's TensorBoard events: every step's scalars and the samples every 2 steps
    tb = EventAccumulator(
        str(shared_cluster["runs"] / run_id / "tensorboard"),
        size_guidance={"scalars": 0, "tensors": 0},
    )
    tb.Reload()
    assert [e.step for e in tb.Scalars("learner/loss")] == [1, 2, 3, 4]
    assert [t.step for t in tb.Tensors("samples/text_summary")] == [2, 4]
