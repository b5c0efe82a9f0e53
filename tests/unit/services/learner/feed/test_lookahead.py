"""services/learner/feed/lookahead.py: each job names the oldest weight version its paths may be
sampled with, and a group whose version is not made yet is held by the feed. Checked against a
simulated learner driving the real JobFeed as the trainer does (a top-up between updates,
another after each group it takes): with no group dropped, every group asks for exactly the
version that uses it minus ``max_staleness``, so a path sampled with it is never stale and one
older always is; with groups dropped none is stale either. The version asked for is always made
when the job goes out, and the update under way never waits for a held group."""

from __future__ import annotations

import random

import pytest

from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from services.learner.feed.jobfeed import JobFeed
from services.learner.feed.lookahead import LearnerAt, min_weight_version, use_version
from services.learner.feed.prompts import Prompt
from tests.memory_queue import MemoryStreamQueue


def config(gps: int, inflight: int, staleness: int, every: int = 1, lag: int = 0) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": "m",
            "data": {"train_path": "t"},
            "sampling": {"n": 4},
            "train": {"groups_per_step": gps},
            "async": {
                "max_inflight_groups": inflight,
                "max_staleness": staleness,
                "publish_every": every,
                "publish_lag": lag,
            },
        }
    )


class Run:
    """A learner that takes groups in the order sent, drops those ``drop`` names (stale,
    all-equal: not used, so the step takes one more) and records, per group cursor, its jobs'
    min_weight_version, the learner's version when it sent them and when it took the group."""

    def __init__(self, cfg: RunConfig, drop=lambda cursor: False):
        self.cfg, self.drop = cfg, drop
        self.queue = MemoryStreamQueue(name="prompts")
        prompts = [Prompt(f"{i}+1=", "") for i in range(50)]
        self.feed = JobFeed("r", cfg, prompts, self.queue, epoch="e")
        self.step = self.version = self.consumed = 0
        self.asked: dict[int, tuple[int, int]] = {}
        self.taken: dict[int, int] = {}
        self.most_in_flight = 0

    def top_up(self, needed: int) -> None:
        self.feed.top_up(self.consumed, LearnerAt(self.step, self.version, needed))
        self.most_in_flight = max(self.most_in_flight, self.feed.cursor - self.consumed)
        for d in self.queue.read(count=1000):
            job = common_pb2.PromptJob.FromString(d.data)
            self.asked[int(job.group_id[1:])] = (job.min_weight_version, self.version)

    def run(self, steps: int) -> dict[int, tuple[int, int, int]]:
        gps, every = self.cfg.train.groups_per_step, self.cfg.asynchrony.publish_every
        while self.step < steps:
            self.top_up(gps)  # between updates
            used = 0
            while used < gps:
                assert self.consumed < self.feed.cursor, "the update under way has no group sent"
                self.taken[self.consumed] = self.version
                used += not self.drop(self.consumed)
                self.consumed += 1
                self.top_up(gps - used)  # GroupIntake.on_consumed, with ``needed``
            self.step += 1
            self.version += self.step % every == 0
        return {c: (*self.asked[c], self.taken[c]) for c in self.taken}


@pytest.mark.parametrize(
    "gps, inflight, staleness, every, lag",
    [
        (2, 4, 2, 1, 0),  # the long shape: two steps ahead
        (2, 8, 2, 1, 0),  # four steps ahead: the last two wait for their versions
        (2, 4, 0, 1, 0),  # on-policy: the next step's groups wait for the version that uses them
        (4, 16, 1, 1, 0),
        (3, 7, 1, 1, 0),  # blocks of 3 out of 7 in flight
        (8, 4, 2, 1, 0),  # fewer in flight than a step takes
        (5, 12, 2, 2, 0),  # a version every second update
        (2, 8, 8, 1, 2),  # the staleness ablation: the workers get versions 2 late
        (2, 8, 1, 1, 3),  # a lag beyond the bound: only the update under way's groups go
    ],
)
def test_each_group_asks_for_exactly_the_oldest_version_its_user_keeps(
    gps, inflight, staleness, every, lag
):
    run = Run(config(gps, inflight, staleness, every, lag))
    groups = run.run(steps=12)
    assert len(groups) == 12 * gps
    for cursor, (asked, sent_at, used_at) in groups.items():
        assert asked == max(0, used_at - max(staleness, lag)), cursor
        assert asked <= max(sent_at - lag, 0), cursor  # made when the job went out
    # the groups that could only be sampled stale are held: fewer than the bound in flight
    steps_ahead = (inflight - 1) // gps  # of the groups the bound lets out, the furthest
    assert (run.most_in_flight < inflight) == (every == 1 and steps_ahead > max(staleness, lag))


@pytest.mark.parametrize("seed", range(5))
def test_with_groups_dropped_no_group_is_stale(seed):
    rng = random.Random(seed)
    dropped = {c for c in range(300) if rng.random() < 0.3}
    cfg = config(gps=3, inflight=12, staleness=1)
    groups = Run(cfg, drop=dropped.__contains__).run(steps=15)
    for asked, sent_at, used_at in groups.values():
        assert used_at - 1 <= asked <= sent_at
    # a group sent before a drop ahead of it is used sooner than forecast: it asks for more
    assert any(asked > used_at - 1 for asked, _, used_at in groups.values())


def test_the_forecast_counts_the_groups_the_update_under_way_still_needs():
    at = LearnerAt(step=4, version=4, needed=1)
    assert [use_version(at, ahead, groups_per_step=2, publish_every=1) for ahead in range(6)] == [
        4, 5, 5, 6, 6, 7,
    ]  # fmt: skip
    between = LearnerAt(step=4, version=4, needed=2)
    assert [use_version(between, a, 2, 1) for a in range(4)] == [4, 4, 5, 5]
    # a version every 3 updates: update 5 makes none, update 6 makes one
    assert [use_version(between, a, 2, 3) for a in range(6)] == [4, 4, 4, 4, 5, 5]
    assert min_weight_version(between, 0, config(2, 4, 2)) == 2
    assert min_weight_version(between, 5, config(2, 8, 2)) == 4  # used by 6: 4 is made
    assert min_weight_version(between, 7, config(2, 8, 2)) is None  # used by 7: 5 is not
    assert min_weight_version(between, 5, config(2, 8, 2, lag=1)) is None  # 4; workers have 3
    assert min_weight_version(LearnerAt(0, 0, 2), 3, config(2, 4, 2)) == 0  # never below 0
