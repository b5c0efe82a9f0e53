"""The rollout worker's loop (services/rollout/worker.py ``step``/``process``) stage by stage,
without vLLM, Redis or a reward service: an in-memory queue, an engine that tokenizes text its
own way, a reward stub that records what it scored.

Each stage of the loop is pinned by a test that fails when the stage is removed: the claim (the
job is taken and its group published), the reload (the group carries the new version), the
selection (an oversampled job keeps n of its M candidates), the scoring (rewards and statuses
set), the publish and ack (the group is on the paths stream, the job no longer pending), and
sampling from the learner's token ids (the group's prompt ids are the job's, not a
re-tokenization of its text)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc
import pytest

from brorl.contract import RewardStatus
from brorl.v1 import common_pb2, reward_pb2
from brorl.weights.store import WeightStore
from services.rollout.worker import RolloutWorker
from tests.memory_queue import MemoryChannels, MemoryRegistry


@dataclass
class Sample:
    token_ids: list
    logprobs: list
    text: str
    finish_reason: str = "length"


class TokenizingEngine:
    """Samples n paths; a text prompt is tokenized as one id per character + 100, which no
    learner tokenizer here produces, so a re-tokenized prompt is visible in the group."""

    def __init__(self):
        self.weight_version = 0
        self.prompts: list = []
        self.loads: list[int] = []
        self.calls: list[tuple[list, dict]] = []  # (prompts, settings) of each call

    def generate(self, prompts, **kwargs):
        if any("refuse" in str(p) for p in prompts):
            raise ValueError("prompt is longer than the maximum model length 16")
        self.calls.append((list(prompts), kwargs))
        out = []
        for prompt in prompts:
            self.prompts.append(prompt)
            ids = list(prompt) if isinstance(prompt, list) else [100 + ord(c) for c in prompt]
            samples = [Sample([5 + i % 3, 6], [-0.5, -0.7], f"c{i}") for i in range(kwargs["n"])]
            out.append((ids, samples))
        return out

    def decode(self, ids):
        return "".join(map(str, ids))

    def load_weights(self, path: str, version: int) -> None:
        self.loads.append(version)
        self.weight_version = version


class RecordingReward:
    def __init__(self, refuse: grpc.StatusCode | None = None):
        self.requests: list = []
        self.refuse = refuse

    def ScoreBatch(self, request, timeout=None):
        self.requests.append(request)
        if self.refuse is not None:
            raise Refused(self.refuse)
        return reward_pb2.ScoreBatchResponse(
            results=[
                reward_pb2.ScoreResult(id=i.id, reward=float(n % 2), status=RewardStatus.OK)
                for n, i in enumerate(request.items)
            ]
        )


class Refused(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "bad job"


def worker_for(channels, engine=None, reward=None, **options) -> RolloutWorker:
    return RolloutWorker(
        engine or TokenizingEngine(),
        threading.Lock(),
        MemoryRegistry(),
        lambda run: channels,
        reward or RecordingReward(),
        **{"run_id": channels.run_id, **options},
    )


def put_job(channels, i=0, n=4, **fields) -> common_pb2.PromptJob:
    job = common_pb2.PromptJob(
        **{
            "run_id": channels.run_id,
            "job_id": f"{channels.run_id}/e/{i}/0",
            "group_id": f"g{i}",
            "prompt_id": f"p{i}",
            "prompt": "1+1=",
            "reference": "2",
            "reward_fn": "exact_match",
            "part_count": 1,
            "sampling": common_pb2.SamplingParams(n=n, temperature=1.0),
            **fields,
        }
    )
    channels.prompts.put(job.SerializeToString())
    return job


def groups(channels) -> list[common_pb2.PathGroup]:
    return [common_pb2.PathGroup.FromString(d.data) for d in channels.paths.read(count=100)]


def test_one_step_claims_generates_scores_publishes_and_acks():
    channels = MemoryChannels("r1")
    worker = worker_for(channels)
    put_job(channels)
    assert worker.step() is True  # claimed and processed
    assert not channels.prompts.pending and not channels.prompts.new  # acked
    [group] = groups(channels)  # published once
    assert group.group_id == "g0" and len(group.paths) == 4 and group.generated == 4
    assert [p.reward for p in group.paths] == [0.0, 1.0, 0.0, 1.0]  # scored
    assert all(p.reward_status == RewardStatus.OK for p in group.paths)
    assert [p.path_id for p in group.paths] == [f"g0/{i}" for i in range(4)]
    assert group.score_seconds >= 0 and group.generate_seconds >= 0
    assert worker.stats.groups_published == 1 and worker.stats.paths_generated == 4
    assert worker.step() is False  # nothing left


def test_a_worker_with_no_run_asks_again_within_a_tenth_of_a_second(monkeypatch):
    """A run's first jobs wait for the worker to notice the run: at 0.5 s between asks the first
    call of a demo_fast run started 0.39 s after its jobs were queued."""
    import services.rollout.worker as worker_module

    naps: list[float] = []
    monkeypatch.setattr(worker_module.time, "sleep", naps.append)
    channels = MemoryChannels("r1")
    worker = worker_for(channels, run_id="")  # follows the registry
    assert worker.step() is False and len(naps) == 1 and 0 < naps[0] <= 0.1
    worker.registry.announce("r1")
    put_job(channels)
    assert worker.step() is True and len(naps) == 1  # the announced run's job, at once


def test_the_worker_samples_from_the_learners_token_ids():
    """The learner sends the ids it checked against the context and trains on; the worker must
    sample from exactly those, not re-tokenize the text (this engine would tokenize it into
    other ids)."""
    channels = MemoryChannels("r1")
    engine = TokenizingEngine()
    worker = worker_for(channels, engine)
    put_job(channels, prompt_token_ids=[7, 8, 9])
    worker.step()
    assert engine.prompts == [[7, 8, 9]]
    [group] = groups(channels)
    assert list(group.prompt_token_ids) == [7, 8, 9]
    assert group.prompt == "1+1="  # the text stays for the reward
    assert [i.prompt for i in worker.rewards.stub.requests[0].items] == ["1+1="] * 4


def test_a_job_without_token_ids_is_tokenized_by_the_engine():
    channels = MemoryChannels("r1")
    engine = TokenizingEngine()
    put_job(channels)
    worker_for(channels, engine).step()
    [group] = groups(channels)
    assert engine.prompts == ["1+1="]
    assert list(group.prompt_token_ids) == [100 + ord(c) for c in "1+1="]


def test_a_newer_weight_version_is_loaded_before_the_job(tmp_path):
    store = WeightStore(tmp_path / "weights")
    staging = store.staging_dir(3)
    (staging / "model.safetensors").write_bytes(b"w")
    channels = MemoryChannels("r1")
    channels.publish_weights(store.commit(3, staging))
    engine = TokenizingEngine()
    worker = worker_for(channels, engine)
    put_job(channels)
    worker.step()
    assert engine.loads == [3]
    [group] = groups(channels)
    assert group.weight_version == 3 and {p.weight_version for p in group.paths} == {3}
    assert worker.stats.reloads == 1


def test_an_oversampled_job_keeps_n_of_its_candidates():
    channels = MemoryChannels("r1")
    worker = worker_for(channels)
    put_job(channels, n=4, explore=common_pb2.ExploreParams(oversample_m=8))
    worker.step()
    [group] = groups(channels)
    assert group.generated == 8 and len(group.paths) == 4
    assert dict(group.dropped) == {"oversample": 4}


def test_a_job_the_reward_service_refuses_is_dead_lettered():
    channels = MemoryChannels("r1")
    worker = worker_for(channels, reward=RecordingReward(grpc.StatusCode.INVALID_ARGUMENT))
    put_job(channels)
    worker.step()
    assert groups(channels) == []
    assert [reason for _, reason in channels.prompts.dead] == [
        "reward service refused the job: bad job"
    ]


def test_a_reward_outage_leaves_the_job_pending_for_a_retry(monkeypatch):
    monkeypatch.setattr("brorl.rpc.call_with_retry", lambda fn, req, timeout: fn(req, timeout))
    channels = MemoryChannels("r1")
    worker = worker_for(channels, reward=RecordingReward(grpc.StatusCode.UNAVAILABLE))
    put_job(channels)
    with pytest.raises(grpc.RpcError):
        worker.step()
    assert groups(channels) == [] and len(channels.prompts.pending) == 1


def test_an_entry_that_is_not_a_job_is_dead_lettered():
    channels = MemoryChannels("r1")
    worker = worker_for(channels)
    channels.prompts.put(b"\xff not a protobuf")
    worker.step()
    assert groups(channels) == [] and not channels.prompts.pending
    assert channels.prompts.dead[0][1].startswith("not a PromptJob")


def test_a_prompt_the_engine_refuses_comes_back_as_an_error_group():
    class Refusing(TokenizingEngine):
        def generate(self, prompts, **kwargs):
            raise ValueError("prompt is longer than the maximum model length 16")

    channels = MemoryChannels("r1")
    worker = worker_for(channels, Refusing())
    put_job(channels)
    worker.step()
    [group] = groups(channels)
    assert group.error.startswith("prompt is longer") and not group.paths
    assert not channels.prompts.pending  # acked with the error group


def test_a_job_with_an_environment_publishes_its_episodes():
    """Every path an episode: its turns and tokens ride on the path, its reward is the
    environment's, and no reward service call is made (env.reward: env)."""
    from brorl.contract import TokenTurn
    from tests.unit.services.rollout.test_episodes import FakeEnv, ScriptedEngine

    class Channels:
        def stub(self, address):
            return FakeEnv()

    channels = MemoryChannels("r1")
    engine = ScriptedEngine()
    engine.weight_version = 0
    engine.max_model_len = 64
    reward = RecordingReward()
    worker = RolloutWorker(engine, threading.Lock(), MemoryRegistry(), lambda run: channels,
                           reward, run_id="r1", environments=Channels())  # fmt: skip
    env = common_pb2.EnvironmentParams(address="env:1", max_turns=3, step_timeout_s=5,
                                       episode_timeout_s=30, max_inflight_steps=4)  # fmt: skip
    ids = engine.encode("6*2=")
    put_job(channels, prompt="6*2=", reference="12", prompt_token_ids=ids, env=env, n=3)
    worker.step()
    [group] = groups(channels)
    assert len(group.paths) == 3 and reward.requests == []
    for path in group.paths:
        assert path.turns == 2 and path.reward == 1.0 and path.reward_status == RewardStatus.OK
        assert len(path.token_turns) == len(path.token_ids) == len(path.logprobs)
        assert TokenTurn.ENVIRONMENT in path.token_turns
        assert list(path.turn_rewards) == [0.0, 1.0]
    assert group.stats["env/turns_mean"] == 2.0


def test_jobs_claimed_together_are_sampled_in_one_engine_call():
    """The first read claims one job (the worker does not know the groups' width yet), then, in
    the same turn and without waiting, as many more as fill batch_paths at its width (16 // 4 =
    4): a run's first call is as full as the later ones. The four are sampled in one call, each
    published as its own group with its own paths and acked; the next turn claims the rest."""
    channels = MemoryChannels("r1")
    engine = TokenizingEngine()
    worker = worker_for(channels, engine, batch_paths=16)
    for i in range(6):
        put_job(channels, i, n=4, prompt=f"{i}+1=")
    assert worker.step()
    assert [len(prompts) for prompts, _ in engine.calls] == [4]
    assert engine.calls[0][0] == ["0+1=", "1+1=", "2+1=", "3+1="]
    published = groups(channels)
    assert [g.group_id for g in published] == ["g0", "g1", "g2", "g3"]
    for g in published:
        assert [p.path_id for p in g.paths] == [f"{g.group_id}/{k}" for k in range(4)]
        assert {p.weight_version for p in g.paths} == {0} and g.generate_seconds >= 0
        assert list(g.prompt_token_ids) == [100 + ord(c) for c in g.prompt]
    assert len(channels.prompts.pending) == 0 and len(channels.prompts.new) == 2
    assert worker.step() and [len(p) for p, _ in engine.calls] == [4, 2]
    assert worker.stats.groups_published == 6 and not channels.prompts.new
    assert not worker.step()  # nothing left to claim


def test_a_wider_first_job_claims_fewer_to_fill_the_call():
    channels = MemoryChannels("r1")
    engine = TokenizingEngine()
    worker = worker_for(channels, engine, batch_paths=16)
    for i in range(4):
        put_job(channels, i, n=8)
    assert worker.step() and [len(p) for p, _ in engine.calls] == [2]


def test_jobs_that_sample_differently_get_their_own_calls():
    channels = MemoryChannels("r1")
    engine = TokenizingEngine()
    worker = worker_for(channels, engine, batch_paths=64)
    put_job(channels, 0, n=4)  # the first read takes this one alone
    worker.step()
    put_job(channels, 1, n=4)
    put_job(channels, 2, n=8)
    put_job(channels, 3, n=4)
    worker.step()
    assert [(len(p), kw["n"]) for p, kw in engine.calls[1:]] == [(2, 4), (1, 8)]
    assert sorted(len(g.paths) for g in groups(channels)) == [4, 4, 4, 8]


def test_a_refused_prompt_does_not_fail_the_others_of_its_call():
    channels = MemoryChannels("r1")
    worker = worker_for(channels, batch_paths=64)
    worker._claim_count = 3
    put_job(channels, 0)
    put_job(channels, 1, prompt="refuse me")
    put_job(channels, 2)
    worker.step()
    published = {g.group_id: g for g in groups(channels)}
    assert published["g1"].error.startswith("prompt is longer") and not published["g1"].paths
    assert len(published["g0"].paths) == len(published["g2"].paths) == 4
    assert not channels.prompts.pending  # all three acked
