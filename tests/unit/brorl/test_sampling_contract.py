"""The learner scores each path under the distribution the worker sampled it from: the
sampling parameters that reach the engine (worker side) must equal the ones the learner
resolves from the path (batch side), for defaults and for every explicitly set value. Both
sides run their real code here (JobFeed → RolloutWorker.process → build_batches); only the
engine, the reward service and Redis are stand-ins."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import pytest

from brorl import sampling
from brorl.config.run import RunConfig
from brorl.v1 import common_pb2, reward_pb2
from services.learner.model.batch import advantages_of, build_batches
from services.learner.feed.jobfeed import JobFeed
from services.learner.feed.lookahead import LearnerAt
from services.learner.feed.prompts import Prompt, resolve_model_defaults
from services.rollout.worker import Claimed, RolloutWorker
from tests.memory_queue import MemoryChannels, MemoryRegistry


@dataclass
class FakeSample:
    token_ids: list
    logprobs: list
    text: str
    finish_reason: str = "length"


class RecordingEngine:
    weight_version = 0

    def __init__(self):
        self.calls: list[dict] = []

    def generate(self, prompts, **kwargs):
        self.calls.append(kwargs)
        n = kwargs["n"]
        return [
            ([3, 4], [FakeSample([5 + i % 3, 6], [-0.5, -0.7], f"c{i}") for i in range(n)])
        ] * len(prompts)

    def decode(self, ids):
        return "".join(map(str, ids))


class AlternatingReward:
    def ScoreBatch(self, request, timeout=None):
        return reward_pb2.ScoreBatchResponse(
            results=[
                reward_pb2.ScoreResult(id=i.id, reward=float(n % 2), status="ok")
                for n, i in enumerate(request.items)
            ]
        )


SETTINGS = {
    "defaults": {},
    "temperature": {"sampling": {"temperature": 0.7}},
    "greedy": {"sampling": {"temperature": 0.0, "n": 1}},
    "top_k": {"sampling": {"top_k": 5}},
    "top_k_off": {"sampling": {"top_k": -1}},
    "top_p": {"sampling": {"top_p": 0.8}},
    "top_p_off": {"sampling": {"top_p": 1.0}},
    "max_tokens": {"sampling": {"max_tokens": 7}},
    "stop": {"sampling": {"stop": ["\n", "="]}},
    "schedule": {"sampling": {"temperature_schedule": {"kind": "constant", "t": 1.3}}},
    "fan_out": {"sampling": {"n": 10, "max_paths_per_job": 4}},
    "oversample": {"sampling": {"n": 6, "max_paths_per_job": 4}, "explore": {"oversample_m": 9}},
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_learner_and_worker_agree_on_every_sampling_field(tmp_path, name):
    cfg = {
        "model": "m",
        "data": {"train_path": "unused"},
        "sampling": {"n": 4},
        "async": {"max_inflight_groups": 1},
    }
    for section, values in SETTINGS[name].items():
        cfg[section] = {**cfg.get(section, {}), **values}
    run_cfg = RunConfig.model_validate(cfg)
    resolve_model_defaults(run_cfg)  # as StartRun does: unset fields from the model's files
    channels = MemoryChannels("r1")
    feed = JobFeed("r1", run_cfg, [Prompt("1+1=", "2")], channels.prompts, epoch="e0")
    feed.top_up(consumed=0, at=LearnerAt(step=0, version=0, needed=1))
    engine = RecordingEngine()
    worker = RolloutWorker(
        engine,
        threading.Lock(),
        MemoryRegistry(),
        lambda run: channels,
        AlternatingReward(),
        run_id="r1",
    )
    jobs = []
    while channels.prompts.new:
        [delivery] = channels.prompts.read()
        jobs.append(common_pb2.PromptJob.FromString(delivery.data))
        worker.process([Claimed(channels, channels.prompts, delivery)])
    groups = [common_pb2.PathGroup.FromString(d.data) for d in channels.paths.read(count=100)]
    assert sum(len(g.paths) for g in groups) == run_cfg.sampling.n
    batches = build_batches(
        groups, advantages_of(groups, normalize_std=False), pad_id=0, max_paths=3
    )
    assert sum(len(b) for b in batches) == run_cfg.sampling.n

    for job, call, group in zip(jobs, engine.calls, groups):
        learner = sampling.effective(group.paths[0].sampling)  # what the learner resolves
        # every field the engine was given, as the learner reads it back from the path
        assert call == {**learner.engine_kwargs(), "n": max(job.explore.oversample_m, learner.n)}
        assert learner.n == len(group.paths)
    for batch in batches:
        call = engine.calls[batch.group_index]
        # the temperature and cut-offs the learner's log-probs are computed with, every path
        expected_t = call["temperature"] if call["temperature"] > 0 else 1.0
        assert batch.temperature.tolist() == pytest.approx([expected_t] * len(batch))
        assert batch.top_k.tolist() == [call["top_k"]] * len(batch)
        assert batch.top_p.tolist() == pytest.approx([call["top_p"]] * len(batch))
    # and what the run config asked for is what the engine got
    s = run_cfg.sampling
    for call in engine.calls:
        assert call["temperature"] == pytest.approx(s.temperature_at(0))
        assert call["top_k"] == (s.top_k if s.top_k > 0 else -1)
        assert call["top_p"] == pytest.approx(s.top_p)
        assert call["max_tokens"] == s.max_tokens
        assert call["stop"] == (list(s.stop) or None)


def test_part_sizes_and_oversample_shares():
    assert sampling.part_sizes(10, 4) == [4, 4, 2]
    assert sampling.part_sizes(10, 0) == [10]
    assert sampling.part_sizes(8, 8) == [8]
    # each part keeps its share of M, never fewer than its own n
    assert [sampling.part_oversample(9, p, 6) for p in (4, 2)] == [6, 3]
    assert sampling.part_oversample(0, 4, 6) == 0
    assert sampling.part_oversample(6, 4, 6) == 4


def test_zero_fields_of_a_received_message_mean_the_documented_defaults():
    e = sampling.effective(common_pb2.SamplingParams(n=3))
    assert (e.temperature, e.top_k, e.top_p, e.max_tokens, e.seed, e.stop) == (
        0.0,
        sampling.TOP_K_OFF,
        sampling.TOP_P_OFF,
        sampling.DEFAULT_MAX_TOKENS,
        None,
        (),
    )
    assert e.logprob_temperature == 1.0 and not e.truncated
    x = sampling.effective_explore(common_pb2.ExploreParams())
    assert (x.dedup, x.dedup_method, x.dedup_threshold, x.retention, x.predictor) == (
        "off",
        "minhash",
        sampling.DEFAULT_DEDUP_THRESHOLD,
        1.0,
        sampling.DEFAULT_PREDICTOR,
    )


def test_run_config_defaults_survive_the_trip_through_a_job():
    """A field the run config sets to its default must not be read as 'unset' on the far side
    with a different meaning (proto3 zeros)."""
    defaults = RunConfig.model_validate({"model": "m", "data": {"train_path": "x"}})
    resolve_model_defaults(defaults)
    [part] = sampling.job_parts(defaults.sampling, defaults.explore, step=0)
    e, x = sampling.effective(part.sampling), sampling.effective_explore(part.explore)
    s, ex = defaults.sampling, defaults.explore
    assert (e.n, e.temperature, e.top_k, e.top_p, e.max_tokens) == (
        s.n,
        s.temperature,
        s.top_k,
        pytest.approx(s.top_p),
        s.max_tokens,
    )
    assert (
        x.dedup,
        x.dedup_method,
        x.dedup_threshold,
        x.retention,
        x.predictor,
        x.predictor_prefix_tokens,
    ) == (
        ex.dedup,
        ex.dedup_method,
        pytest.approx(ex.dedup_threshold),
        ex.retention,
        ex.predictor,
        ex.predictor_prefix_tokens,
    )
    assert json.loads(json.dumps(list(e.stop))) == s.stop


class RecordingReward(AlternatingReward):
    def __init__(self):
        self.requests: list[reward_pb2.ScoreBatchRequest] = []

    def ScoreBatch(self, request, timeout=None):
        self.requests.append(request)
        return super().ScoreBatch(request, timeout)


def test_extra_fields_reach_the_reward_function_and_eval_jobs_come_back_marked():
    """JobFeed and HeldoutEval jobs through the real worker: a prompt's extra data fields are in
    every ScoreRequest and on the group; an evaluation job's group is marked eval."""
    from services.learner.feed.heldout import HeldoutEval

    cfg = RunConfig.model_validate(
        {"model": "m", "data": {"train_path": "x"}, "sampling": {"n": 2}, "eval_every": 1}
    )
    resolve_model_defaults(cfg)
    channels, reward = MemoryChannels("r1"), RecordingReward()
    extra = {"level": "hard", "tests": '["assert f() == 1"]'}
    JobFeed("r1", cfg, [Prompt("1+1=", "2", extra)], channels.prompts, epoch="e0").send(0, 0)
    heldout = HeldoutEval(
        "r1",
        cfg,
        [Prompt("2+2=", "4", {"level": "easy"})],
        channels.prompts,
        "e0",
        emit=lambda step, values: None,
        timeout_s=5,
    )
    heldout.start(0)
    worker = RolloutWorker(
        RecordingEngine(),
        threading.Lock(),
        MemoryRegistry(),
        lambda run: channels,
        reward,
        run_id="r1",
    )
    while channels.prompts.new:
        [delivery] = channels.prompts.read()
        worker.process([Claimed(channels, channels.prompts, delivery)])
    train, held = [common_pb2.PathGroup.FromString(d.data) for d in channels.paths.read(count=9)]
    assert dict(train.extra) == extra and not train.eval
    assert dict(held.extra) == {"level": "easy"} and held.eval and len(held.paths) == 1
    assert [dict(i.extra) for i in reward.requests[0].items] == [extra, extra]
    assert [dict(i.extra) for i in reward.requests[1].items] == [{"level": "easy"}]
