"""Faults the learner loop survives, driven with the in-memory queue (the Redis-backed ones —
crash and resume, Redis restarts, bounded growth — are in tests/integration/test_learner_faults.py):
dead-lettered jobs, prompts the engine refused, failed rewards, non-finite numbers."""

from __future__ import annotations

import math

import pytest

from tests.unit.services.learner.test_trainer_loop import (
    RecordingPolicy,
    fake_rollout,
    mixed,
    run_trainer,
)


def dead_lettering(rollout, doomed):
    """``rollout`` that dead-letters (instead of answering) every job ``doomed(job)`` names, as
    a worker does after too many deliveries."""
    from brorl.v1 import common_pb2

    def answer(ch) -> None:
        keep = []
        while ch.prompts.new:
            [d] = ch.prompts.read(count=1)
            job = common_pb2.PromptJob.FromString(d.data)
            if doomed(job):
                ch.prompts.dead_letter(d.entry_id, d.data, "delivered 6 times")
            else:
                keep.append(d.entry_id)
        ch.prompts.new = keep + ch.prompts.new  # the rest is answered as usual
        for e in keep:
            ch.prompts.pending.pop(e, None)
        rollout(ch)

    return answer


def test_a_dead_lettered_job_is_resent_then_given_up_and_the_run_goes_on(tmp_path):
    jobs_seen = []

    def doomed(job):
        jobs_seen.append(job.job_id)
        return job.group_id == "g1"  # every delivery of g1 dies, re-sent ones too

    policy, steps, channels = run_trainer(
        tmp_path, dead_lettering(fake_rollout(mixed), doomed), **{"async": {"group_timeout_s": 3}}
    )
    trained = [g.group_id for u in policy.updates for g in u]
    assert len(policy.updates) == 3 and "g1" not in trained
    assert any(j.endswith("/retry1") for j in jobs_seen)  # re-sent once (dead_letter_retries)
    assert steps[-1]["learner/dropped_groups/lost"] == 1


def test_a_fanned_out_group_completes_from_the_parts_that_arrived(tmp_path):
    policy, steps, _ = run_trainer(
        tmp_path,
        dead_lettering(
            fake_rollout(mixed), lambda job: job.group_id == "g0" and job.part_index == 2
        ),
        sampling={"n": 8, "max_paths_per_job": 3},
        **{"async": {"dead_letter_retries": 0, "group_timeout_s": 3}},
    )
    g0 = next(g for u in policy.updates for g in u if g.group_id == "g0")
    assert [p.path_id for p in g0.paths] == [f"g0/{i}" for i in range(6)]  # parts 0 and 1
    assert steps[-1]["learner/partial_groups"] == 1


def test_a_part_that_never_comes_is_given_up_at_the_part_deadline(tmp_path):
    def silent_part(ch):  # part 1 of g0 is taken by a worker that never answers
        import time

        from brorl.v1 import common_pb2

        time.sleep(0.2)  # the other groups take a while: g0's deadline passes mid-run

        for e in list(ch.prompts.new):
            job = common_pb2.PromptJob.FromString(ch.prompts.entries[e])
            if job.group_id == "g0" and job.part_index == 1:
                ch.prompts.new.remove(e)
        fake_rollout(mixed)(ch)

    policy, steps, _ = run_trainer(
        tmp_path,
        silent_part,
        sampling={"n": 4, "max_paths_per_job": 2},
        train={"steps": 6, "groups_per_step": 2},  # ≥ 6 answers of 0.2 s: past the deadline
        **{"async": {"part_deadline_s": 0.3, "group_timeout_s": 5, "max_staleness": 100}},
    )
    g0 = next(g for u in policy.updates for g in u if g.group_id == "g0")
    assert len(g0.paths) == 2 and steps[-1]["learner/partial_groups"] == 1


def test_a_prompt_the_engine_refused_is_dropped_with_a_reason(tmp_path):
    def refusing(ch):
        fake_rollout(mixed)(ch)
        from brorl.v1 import common_pb2

        for e in list(ch.paths.new):
            group = common_pb2.PathGroup.FromString(ch.paths.entries[e])
            if group.group_id == "g2":
                del group.paths[:]
                group.error = "prompt is longer than the maximum model length 64"
                ch.paths.entries[e] = group.SerializeToString()

    policy, steps, _ = run_trainer(tmp_path, refusing, **{"async": {"group_timeout_s": 3}})
    assert len(policy.updates) == 3
    assert "g2" not in [g.group_id for u in policy.updates for g in u]
    assert steps[-1]["learner/dropped_groups/rejected"] == 1


def test_failed_rewards_are_left_out_not_counted_as_zero(tmp_path):
    from brorl.v1 import common_pb2

    def failing(ch):
        fake_rollout(mixed)(ch)
        for e in list(ch.paths.new):
            group = common_pb2.PathGroup.FromString(ch.paths.entries[e])
            k = int(group.group_id[1:])
            if k % 2 == 0:  # even groups: path 0 timed out, path 1 errored
                group.paths[0].reward_status, group.paths[0].reward = "timeout", 0.0
                group.paths[1].reward_status, group.paths[1].reward = "error", 0.0
            if k == 1:  # one usable path left: no group baseline
                for p in group.paths[1:]:
                    p.reward_status = "error"
            if k == 3:  # a NaN reward from a foreign reward service
                group.paths[2].reward = math.nan
            ch.paths.entries[e] = group.SerializeToString()

    policy, steps, _ = run_trainer(tmp_path, failing, **{"async": {"group_timeout_s": 3}})
    trained = {g.group_id: g for u in policy.updates for g in u}
    assert "g1" not in trained and {"g0", "g3", "g5"} <= set(trained)
    assert [len(trained[g].paths) for g in ("g0", "g3", "g5")] == [2, 3, 4]
    for g in trained.values():
        assert all(p.reward_status not in ("error", "timeout") for p in g.paths)
        assert all(math.isfinite(p.reward) for p in g.paths)
    even = sum(1 for gid in trained if int(gid[1:]) % 2 == 0)
    last = steps[-1]
    assert last["learner/dropped_groups/reward_failed"] == 1
    assert last["learner/excluded_paths/timeout"] == even
    assert last["learner/excluded_paths/error"] == even + 3
    assert last["learner/excluded_paths/nonfinite"] == 1


class SkippingPolicy(RecordingPolicy):
    """Reports a non-finite loss on the updates listed in ``skip`` (0-based update calls)."""

    def __init__(self, skip):
        super().__init__()
        self.skip, self.calls = set(skip), 0
        self.saved = 0

    def update(self, groups):
        self.calls += 1
        if self.calls - 1 in self.skip:
            return {"learner/skipped_step": 1.0, "learner/skipped_nonfinite_loss": 1.0}
        return super().update(groups)

    def weights(self):
        self.saved += 1
        return super().weights()


def test_a_skipped_update_is_counted_and_publishes_nothing(tmp_path):
    policy = SkippingPolicy(skip={1})
    _, steps, channels = run_trainer(tmp_path, fake_rollout(mixed), policy=policy)
    assert policy.calls == 4 and len(policy.updates) == 3  # 3 steps took 4 updates
    assert [p.version for p in channels.pointers] == [0, 1, 2, 3]  # no version for the skip
    assert steps[-1]["learner/skipped_steps"] == 1


def test_consecutive_skipped_updates_fail_the_run_with_a_message(tmp_path):
    with pytest.raises(FloatingPointError, match="3 updates in a row had a non-finite"):
        run_trainer(tmp_path, fake_rollout(mixed), policy=SkippingPolicy(skip={0, 1, 2}))
