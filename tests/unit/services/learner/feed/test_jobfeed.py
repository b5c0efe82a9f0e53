"""services/learner/feed/jobfeed.py's top-up: up to ``max_inflight_groups`` groups in flight, sent
a block at a time (a step's groups, or half the bound where that is less), each block in one
put (one Redis transaction), so that a worker wakes to a step's jobs together."""

from __future__ import annotations

import pytest

from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from services.learner.feed.jobfeed import JobFeed
from services.learner.feed.lookahead import LearnerAt
from services.learner.feed.prompts import Prompt
from tests.memory_queue import MemoryStreamQueue


class BatchRecordingQueue(MemoryStreamQueue):
    def __init__(self):
        super().__init__(name="prompts")
        self.batches: list[list[str]] = []  # the group ids of each put_many

    def put_many(self, items: list[bytes]) -> list[str]:
        if items:
            self.batches.append([common_pb2.PromptJob.FromString(d).group_id for d in items])
        return super().put_many(items)


def at(step: int) -> LearnerAt:
    """A learner at ``step`` and version 0: every job asks for version 0 (none)."""
    return LearnerAt(step=step, version=0, needed=1)


def feed_for(groups_per_step: int, max_inflight: int, parts: int = 1) -> JobFeed:
    cfg = RunConfig.model_validate(
        {
            "model": "m",
            "data": {"train_path": "t"},
            "sampling": {"n": 8, **({"max_paths_per_job": 8 // parts} if parts > 1 else {})},
            "train": {"groups_per_step": groups_per_step},
            "async": {"max_inflight_groups": max_inflight},
        }
    )
    prompts = [Prompt(f"{i}+1=", str(i + 1)) for i in range(40)]
    return JobFeed("r", cfg, prompts, BatchRecordingQueue(), epoch="e")


def test_groups_go_out_a_step_at_a_time_in_one_put():
    feed = feed_for(groups_per_step=2, max_inflight=4)
    feed.top_up(consumed=0, at=at(0))
    assert feed.queue.batches == [["g0", "g1", "g2", "g3"]] and feed.cursor == 4
    feed.top_up(consumed=1, at=at(0))  # one slot free: less than a step's groups, nothing goes
    assert len(feed.queue.batches) == 1 and feed.cursor == 4
    feed.top_up(consumed=2, at=at(1))
    assert feed.queue.batches[-1] == ["g4", "g5"] and feed.cursor == 6
    feed.top_up(consumed=5, at=at(2))  # three free (a dropped group): all three go together
    assert feed.queue.batches[-1] == ["g6", "g7", "g8"] and feed.cursor == 9


@pytest.mark.parametrize(
    "groups_per_step, max_inflight, block",
    [(2, 4, 2), (8, 16, 8), (4, 8, 4), (8, 4, 2), (3, 3, 1), (1, 1, 1), (5, 7, 3)],
)
def test_a_block_is_a_steps_groups_or_half_the_bound(groups_per_step, max_inflight, block):
    feed = feed_for(groups_per_step, max_inflight)
    assert feed.block == block
    feed.top_up(consumed=0, at=at(0))
    assert feed.cursor == max_inflight
    feed.top_up(consumed=block - 1, at=at(0))
    assert feed.cursor == max_inflight  # not yet a block free
    feed.top_up(consumed=block, at=at(0))
    assert feed.cursor == max_inflight + block


def test_a_groups_parts_go_out_together():
    feed = feed_for(groups_per_step=2, max_inflight=2, parts=2)
    feed.top_up(consumed=0, at=at(0))
    assert feed.queue.batches == [["g0", "g0", "g1", "g1"]]
    feed.send(7, step=3)  # a re-sent group (after a resume): its parts in one put too
    assert feed.queue.batches[-1] == ["g7", "g7"]


class FailingQueue(BatchRecordingQueue):
    def put_many(self, items):
        raise ConnectionError("Redis is down")


def test_a_failed_put_leaves_the_cursor_where_it_was():
    feed = feed_for(groups_per_step=2, max_inflight=4)
    feed.queue = FailingQueue()
    with pytest.raises(ConnectionError):
        feed.top_up(consumed=0, at=at(0))
    assert feed.cursor == 0  # the retry sends the same groups, none is skipped
