"""Held-out evaluation rounds during a run (``eval_every``): greedy jobs through the same
queue, never trained on, metrics per round; rounds whose jobs never come back still close."""

from __future__ import annotations

import json

import pytest

from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from brorl.weights.store import WeightStore
from services.learner.feed.heldout import round_metrics
from services.learner.observe.runstate import RunState
from services.learner.train import Trainer
from tests.memory_queue import MemoryChannels, MemoryRegistry
from tests.unit.services.learner.test_trainer_loop import RecordingPolicy, fake_rollout, mixed


def test_round_metrics():
    m = round_metrics([1.0, 0.0, 1.0, 0.5], versions=[3, 4, 4, 2], missing=1, failed=2)
    assert m["eval/accuracy"] == pytest.approx(0.5)  # full reward only
    assert m["eval/reward_mean"] == pytest.approx(0.625)
    assert (m["eval/prompts"], m["eval/missing"], m["eval/failed"]) == (4, 1, 2)
    assert m["eval/weight_version"] == 4
    assert round_metrics([], [], missing=3)["eval/accuracy"] == 0.0


def test_round_metrics_per_stratum():
    rewards = [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0]
    strata = ["easy", "hard", "easy", "", "hard", "easy", "mid"]
    m = round_metrics(rewards, [1] * 7, missing=0, strata=strata)
    assert m["eval/accuracy"] == pytest.approx(4 / 7)  # every prompt, unlabelled ones too
    assert m["eval/accuracy/easy"] == pytest.approx(2 / 3)
    assert m["eval/accuracy/hard"] == 0.0  # 0.5 is not the full reward
    assert m["eval/accuracy/mid"] == 1.0
    assert (m["eval/prompts/easy"], m["eval/prompts/hard"], m["eval/prompts/mid"]) == (3, 2, 1)
    assert not [k for k in m if k.endswith("/")]  # no stratum named ''
    assert not [k for k in round_metrics(rewards, [1] * 7, 0) if k.count("/") > 1]


def run(tmp_path, rollout, steps=4, eval_every=2, labels=None):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(20)))
    rows = [{"prompt": f"{i}+5="} | ({"level": labels[i]} if labels else {}) for i in range(4)]
    held.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fields = {"stratum": "level"} if labels else {}
    cfg = RunConfig.model_validate(
        {
            "model": str(tmp_path),
            "data": {"train_path": str(train), "eval_path": str(held), "fields": fields},
            "sampling": {"n": 4, "top_k": -1, "top_p": 1.0, "temperature": 0.9},
            "train": {"steps": steps, "groups_per_step": 2},
            "async": {"max_inflight_groups": 4, "group_timeout_s": 3},
            "eval_every": eval_every,
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    policy, channels = RecordingPolicy(), MemoryChannels("r1", rollout)
    trainer = Trainer(
        "r1",
        cfg,
        RunState("r1", run_dir, steps),
        channels,
        MemoryRegistry(),
        WeightStore(tmp_path / "weights"),
        lambda: policy,
    )
    trainer.run()
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return policy, records


def test_rounds_at_start_every_k_steps_and_end_are_never_trained_on(tmp_path):
    eval_jobs = []

    def rewards(job):
        if job.eval:
            eval_jobs.append(job)
            return [1.0 if int(job.prompt_id[1:]) % 2 == 0 else 0.0]  # e0, e2 right
        return mixed(job)

    policy, records = run(tmp_path, fake_rollout(rewards), steps=4, eval_every=2)
    rounds = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in rounds] == [0, 2, 4]
    for r in rounds:
        assert (r["eval/prompts"], r["eval/accuracy"], r["eval/missing"]) == (4, 0.5, 0)
    # one greedy path per held-out prompt, the run's length
    assert len(eval_jobs) == 12
    for job in eval_jobs:
        s = job.sampling
        assert (s.n, s.temperature, s.top_k, s.top_p, s.max_tokens) == (1, 0.0, -1, 1.0, 16)
        assert job.prompt.endswith("+5=")
    trained = [g for update in policy.updates for g in update]
    assert len(policy.updates) == 4 and len(trained) == 8
    assert not [g for g in trained if g.eval or g.prompt_id.startswith("e")]
    start = next(r for r in records if r["event"] == "start")
    assert (start["data/train_prompts"], start["data/heldout_prompts"]) == (20, 4)


def test_rounds_report_accuracy_per_stratum_of_the_heldout_prompts(tmp_path):
    def rewards(job):  # e0, e2 right
        return [1.0 if int(job.prompt_id[1:]) % 2 == 0 else 0.0] if job.eval else mixed(job)

    _, records = run(tmp_path, fake_rollout(rewards), 2, 0, ["hard", "easy", "easy", "hard"])
    for r in [r for r in records if r["event"] == "eval"]:
        assert (r["eval/accuracy/easy"], r["eval/accuracy/hard"]) == (0.5, 0.5)
        assert (r["eval/prompts/easy"], r["eval/prompts/hard"], r["eval/accuracy"]) == (2, 2, 0.5)
    (tmp_path / "b").mkdir()
    _, records = run(tmp_path / "b", fake_rollout(rewards), 2, 0, ["a", "a", "a", "b"])
    r = next(r for r in records if r["event"] == "eval")
    assert (r["eval/accuracy/a"], r["eval/accuracy/b"]) == (2 / 3, 0.0)


def test_a_stratum_that_cannot_name_a_metric_is_refused(tmp_path):
    from brorl.errors import InvalidArgument
    from services.learner.feed.prompts import rows_to_prompts

    data = RunConfig.model_validate(
        {"model": "m", "data": {"train_path": "t", "fields": {"stratum": "level"}}}
    ).data
    [p] = rows_to_prompts([{"prompt": "1+1=", "level": 3}], data, None, "held")
    assert p.stratum == "3"
    with pytest.raises(InvalidArgument, match="held row 2: stratum 'a/b'"):
        rows_to_prompts([{"prompt": "x"}, {"prompt": "y", "level": "a/b"}], data, None, "held")


def test_a_round_whose_jobs_never_come_back_closes_with_them_missing(tmp_path):
    def rewards(job):
        return mixed(job)

    answer = fake_rollout(rewards)

    def rollout_without_eval(ch):
        # drop evaluation jobs on the floor: acked, never answered
        kept = []
        while ch.prompts.new:
            [d] = ch.prompts.read(count=1)
            kept.append(d)
        for d in kept:
            if not common_pb2.PromptJob.FromString(d.data).eval:
                ch.prompts.put(d.data)  # training jobs go back to be answered
            ch.prompts.ack(d.entry_id)
        answer(ch)

    policy, records = run(tmp_path, rollout_without_eval, steps=2, eval_every=0)
    rounds = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in rounds] == [0, 2]  # start and end only
    assert all((r["eval/prompts"], r["eval/missing"]) == (0, 4) for r in rounds)
    assert len(policy.updates) == 2
