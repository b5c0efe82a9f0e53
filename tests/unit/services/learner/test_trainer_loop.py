"""The learner loop's intake rules, driven without Redis, vLLM or DeepSpeed: an in-memory
queue, a fake rollout that answers prompt jobs, and a policy that records what it was given."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from brorl.weights.store import WeightStore
from services.learner.observe.runstate import RunState
from services.learner.observe.thread_clock import SCHEDSTAT
from services.learner.train import Trainer
from tests.memory_queue import MemoryChannels, MemoryRegistry


class RecordingPolicy:
    """Stands in for services.learner.model.policy.Policy: records each update's groups."""

    def __init__(self):
        self.updates: list[list[common_pb2.PathGroup]] = []
        self.warms: list[tuple[int, int, int]] = []  # (paths, length, updates before it)
        self.on_warm = lambda: None

    def warm_forward(self, paths: int, length: int) -> float:
        self.warms.append((paths, length, len(self.updates)))
        self.on_warm()
        return 0.0

    def update(self, groups) -> dict[str, float]:
        self.updates.append(list(groups))
        return {
            "learner/loss": 0.0,
            "learner/nonzero_paths": float(sum(len(g.paths) for g in groups)),
        }

    def weights(self) -> dict[str, np.ndarray]:
        return {"w": np.zeros(4, dtype=np.float32)}

    def export(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        return out

    def save_checkpoint(self, directory: str, tag: str, client_state: dict) -> None:
        Path(directory, tag).mkdir(parents=True, exist_ok=True)
        Path(directory, tag, "client.json").write_text(json.dumps(client_state))

    def load_checkpoint(self, directory: str) -> dict:
        raise FileNotFoundError(directory)


def fake_rollout(
    rewards, version_of=lambda job, current: current, repeat=lambda job: 1, order=None
):
    """Answer every pending prompt job: ``rewards(job)`` gives the part's rewards; each group is
    tagged with ``version_of(job, newest published version)``; ``repeat(job)`` publications of
    the same result (a duplicate delivery); ``order`` may reorder a batch of answers."""

    def answer(ch: MemoryChannels) -> None:
        jobs = []
        while ch.prompts.new:
            [d] = ch.prompts.read(count=1)
            jobs.append((d, common_pb2.PromptJob.FromString(d.data)))
        for d, job in order(jobs) if order else jobs:
            r = rewards(job)
            group = common_pb2.PathGroup(
                run_id=ch.run_id,
                group_id=job.group_id,
                prompt_id=job.prompt_id,
                prompt_token_ids=[3, 4],
                weight_version=version_of(job, ch.read_weights().version),
                part_index=job.part_index,
                part_count=job.part_count,
                generated=len(r),
                eval=job.eval,
            )
            for i, reward in enumerate(r):
                group.paths.add(
                    path_id=f"{job.group_id}/{job.path_offset + i}",
                    group_id=job.group_id,
                    token_ids=[5, 6],
                    logprobs=[-0.5, -0.5],
                    reward=reward,
                    weight_version=group.weight_version,
                    sampling=job.sampling,
                    worker=f"w{job.part_index}",
                )
            for _ in range(repeat(job)):
                ch.paths.put(group.SerializeToString())  # a re-sent job's group arrives again
            ch.prompts.ack(d.entry_id)

    return answer


def run_trainer(
    tmp_path, rollout, policy: RecordingPolicy | None = None, **overrides
) -> tuple[RecordingPolicy, list[dict], MemoryChannels]:
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{i}+1=", "reference": str(i + 1)}) + "\n" for i in range(20)
        )
    )
    cfg = {
        "model": str(tmp_path),
        "data": {"train_path": str(data)},
        "sampling": {"n": 4, "top_k": -1, "top_p": 1.0},
        "train": {"steps": 3, "groups_per_step": 2},
        "async": {"max_inflight_groups": 4, "group_timeout_s": 5},
    }
    for section, values in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    channels, policy = MemoryChannels("r1", rollout), policy or RecordingPolicy()
    state = RunState("r1", run_dir, cfg["train"]["steps"])
    trainer = Trainer(
        "r1",
        RunConfig.model_validate(cfg),
        state,
        channels,
        MemoryRegistry(),
        WeightStore(tmp_path / "weights"),
        lambda: policy,
    )
    trainer.run()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return policy, [m for m in metrics if "learner/loss" in m], channels


def mixed(job):
    return [1.0, 0.0] * (job.sampling.n // 2) + [0.0] * (job.sampling.n % 2)


def test_every_group_is_trained_once_and_all_entries_are_acked(tmp_path):
    policy, steps, channels = run_trainer(tmp_path, fake_rollout(mixed))
    ids = [g.group_id for update in policy.updates for g in update]
    assert len(policy.updates) == 3 and len(ids) == 6 and len(set(ids)) == 6
    assert not channels.paths.pending  # used groups are acked after their update
    assert [p.version for p in channels.pointers] == [0, 1, 2, 3]


def test_a_group_delivered_twice_is_trained_once(tmp_path):
    policy, steps, _ = run_trainer(tmp_path, fake_rollout(mixed, repeat=lambda job: 2))
    ids = [g.group_id for update in policy.updates for g in update]
    assert len(ids) == len(set(ids)) == 6
    assert sum(m["learner/duplicate_groups"] for m in steps) >= 3


def test_stale_groups_are_dropped_and_counted(tmp_path):
    # every third group comes from weights 3 versions old; the bound is 1
    def version_of(job, current):
        return current - 3 if int(job.group_id[1:]) % 3 == 0 else current

    policy, steps, _ = run_trainer(
        tmp_path, fake_rollout(mixed, version_of=version_of), **{"async": {"max_staleness": 1}}
    )
    trained = [g for update in policy.updates for g in update]
    assert trained and all(int(g.group_id[1:]) % 3 != 0 for g in trained)
    assert steps[-1]["learner/dropped_stale"] >= 2
    assert steps[-1]["learner/dropped_paths/stale"] == 4 * steps[-1]["learner/dropped_stale"]
    assert max(m["rollout/staleness"] for m in steps) <= 1


def test_groups_with_all_rewards_equal_are_skipped(tmp_path):
    def rewards(job):  # even groups: every path right; odd groups: a mix
        return [1.0] * job.sampling.n if int(job.group_id[1:]) % 2 == 0 else mixed(job)

    policy, steps, _ = run_trainer(tmp_path, fake_rollout(rewards))
    trained = [g for update in policy.updates for g in update]
    assert len(trained) == 6 and all(int(g.group_id[1:]) % 2 == 1 for g in trained)
    assert steps[-1]["learner/skipped_degenerate"] >= 5


def test_a_run_of_degenerate_groups_fails_with_a_message(tmp_path):
    with pytest.raises(RuntimeError, match="3 groups in a row had all rewards equal"):
        run_trainer(
            tmp_path,
            fake_rollout(lambda job: [0.0] * job.sampling.n),
            **{"async": {"max_degenerate_streak": 3}},
        )


def test_fanned_out_parts_are_reassembled_in_any_order(tmp_path):
    # n = 8 in parts of 3, 3, 2 answered newest-first, and one part delivered twice
    policy, steps, _ = run_trainer(
        tmp_path,
        fake_rollout(
            mixed,
            repeat=lambda job: 2 if job.part_index == 1 else 1,
            order=lambda jobs: list(reversed(jobs)),
        ),
        sampling={"n": 8, "max_paths_per_job": 3},
    )
    trained = [g for update in policy.updates for g in update]
    assert len(trained) == 6
    for g in trained:
        assert [p.path_id for p in g.paths] == [f"{g.group_id}/{i}" for i in range(8)]
        assert g.part_count == 1 and g.generated == 8
    assert sum(m["learner/duplicate_parts"] for m in steps) >= 1


def test_step_metrics_describe_every_group_of_the_step(tmp_path):
    # group k's paths all earn k/10 except one: the mean over a step's groups is not the last's
    def rewards(job):
        k = int(job.group_id[1:]) + 1
        return [k / 10] * (job.sampling.n - 1) + [0.0]

    policy, steps, _ = run_trainer(tmp_path, fake_rollout(rewards))
    for update, m in zip(policy.updates, steps):
        every = [p.reward for g in update for p in g.paths]
        assert m["reward/mean"] == pytest.approx(sum(every) / len(every))
        assert m["rollout/step_groups"] == len(update)


def test_every_version_reaches_the_workers_from_the_publish_thread(tmp_path):
    _, steps, channels = run_trainer(tmp_path, fake_rollout(mixed))
    assert channels.read_weights().version == 3  # version 0 + one a step, the last one flushed
    assert all(m["learner/publish_wait_s"] >= 0 for m in steps)


def test_a_failing_weight_write_fails_the_run_and_nothing_is_sent_after_it(tmp_path, monkeypatch):
    from services.learner.publish import WeightPublisher

    real = WeightPublisher.publish_bits

    def failing(self, bits, point, version, step):
        if version == 2:
            raise OSError("no space left on device")
        return real(self, bits, point, version, step)

    monkeypatch.setattr(WeightPublisher, "publish_bits", failing)
    with pytest.raises(OSError, match="no space left"):
        run_trainer(tmp_path, fake_rollout(mixed), train={"steps": 6})
    store = WeightStore(tmp_path / "weights")
    assert store.version_dir(1).exists()
    assert not store.version_dir(2).exists() and not store.version_dir(3).exists()


def test_the_first_forward_runs_while_the_first_jobs_are_sampled(tmp_path, monkeypatch):
    """Trainer._warm_forward: once per run, after the first jobs are enqueued and before the
    first update, a micro-batch as long as the longest prompt plus max_tokens."""
    made: list[MemoryChannels] = []

    class Channels(MemoryChannels):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(sys.modules[__name__], "MemoryChannels", Channels)
    policy, queued = RecordingPolicy(), []
    policy.on_warm = lambda: queued.append(len(made[0].prompts.entries))
    run_trainer(
        tmp_path,
        fake_rollout(mixed),
        policy,
        sampling={"max_tokens": 7},
        train={"micro_batch_paths": 3},
    )
    assert policy.warms == [(3, 7, 0)]  # no prompt token ids here: the length is max_tokens
    assert queued == [4]  # the first jobs (max_inflight_groups) were sent before it
    assert len(policy.updates) == 3


@pytest.mark.skipif(not SCHEDSTAT.exists(), reason="the kernel reports no per-thread schedstat")
def test_each_step_reports_the_updates_seconds_running_and_waiting_for_a_core(tmp_path):
    """learner/update_running_s and learner/update_runnable_s: the training thread's part of the
    update (services/learner/observe/thread_clock.py), not the whole process's."""

    class SpinningPolicy(RecordingPolicy):
        def update(self, groups):
            end = time.thread_time() + 0.15  # 0.15 s of this thread's CPU
            while time.thread_time() < end:
                pass
            return super().update(groups)

    _, steps, _ = run_trainer(tmp_path, fake_rollout(mixed), SpinningPolicy())
    assert len(steps) == 3
    for m in steps:
        assert m["learner/update_running_s"] >= 0.14
        assert m["learner/update_runnable_s"] >= 0.0
        spent = m["learner/update_running_s"] + m["learner/update_runnable_s"]
        assert spent <= m["learner/update_s"] + 0.005


def test_the_policy_trains_on_the_kept_paths_and_the_counters_see_every_path(tmp_path):
    """train.keep_paths: each group of 8 (4 right, 4 wrong) reaches the update as 4 paths, 2 of
    each (max_variance); the rollout's counters and the groups logged keep all 8."""
    policy, steps, _ = run_trainer(
        tmp_path, fake_rollout(mixed), sampling={"n": 8}, train={"keep_paths": 4}
    )
    trained = [g for update in policy.updates for g in update]
    assert len(trained) == 6
    for g in trained:
        assert sorted(p.reward for p in g.paths) == [0.0, 0.0, 1.0, 1.0]
        assert len({p.path_id for p in g.paths}) == 4
    assert steps[-1]["rollout/paths"] == 6 * 8
    assert steps[-1]["explore/eur"] == pytest.approx(0.5)
