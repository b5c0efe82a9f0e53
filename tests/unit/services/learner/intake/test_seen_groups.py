"""The learner's consumed group ids (services/learner/intake/seen_groups.py): a watermark plus the
few consumed cursors above it, whatever the order groups arrive in.

Mutations tried, each failing a test here: the watermark never advancing (the ``while`` removed:
a million groups then keep a million ids), ``c < watermark`` as ``c <= watermark`` in
``__contains__`` (the watermark's own cursor counted consumed), ``missing`` returning the cursors
above the watermark that were consumed instead of those not consumed, and ``from_state``
dropping ``above``."""

from __future__ import annotations

import pytest

from services.learner.feed import ids
from services.learner.intake.seen_groups import SeenGroups


def test_out_of_order_groups_advance_the_watermark_only_when_contiguous():
    seen = SeenGroups()
    for c in (2, 0, 4):
        seen.add(ids.group_id(c))
    assert (seen.watermark, sorted(seen.above)) == (1, [2, 4])
    assert [ids.group_id(c) in seen for c in range(6)] == [True, False, True, False, True, False]
    seen.add("g1")
    assert (seen.watermark, sorted(seen.above)) == (3, [4])
    seen.add("g3")
    assert (seen.watermark, seen.above) == (5, set())
    assert len(seen) == 5


def test_adding_a_group_twice_changes_nothing():
    seen = SeenGroups()
    for gid in ("g0", "g0", "g2", "g2"):
        seen.add(gid)
    assert (seen.watermark, seen.above, len(seen)) == (1, {2}, 2)


def test_missing_are_the_cursors_in_flight():
    seen = SeenGroups()
    for c in (0, 1, 3, 6):
        seen.add(ids.group_id(c))
    # 8 groups enqueued (cursor 8): 2, 4, 5 and 7 never came back
    assert seen.missing(8) == [2, 4, 5, 7]
    assert seen.missing(2) == []


def test_memory_stays_bounded_by_the_groups_in_flight():
    seen = SeenGroups()
    window = 64  # groups in flight at once, arriving in any order within the window
    order = [
        c for base in range(0, window * 1000, window) for c in reversed(range(base, base + window))
    ]
    for c in order:
        seen.add(ids.group_id(c))
        assert len(seen.above) < window
    assert (seen.watermark, seen.above) == (64_000, set())
    assert seen.state() == {"watermark": 64_000, "above": []}


def test_state_round_trips_through_a_checkpoint():
    seen = SeenGroups()
    for c in (0, 1, 5, 9):
        seen.add(ids.group_id(c))
    again = SeenGroups.from_state(seen.state())
    assert (again.watermark, again.above) == (2, {5, 9})
    assert [ids.group_id(c) in again for c in range(10)] == [
        ids.group_id(c) in seen for c in range(10)
    ]


def test_ids_the_job_feed_did_not_make_are_never_seen_and_cannot_be_added():
    seen = SeenGroups(watermark=10)
    for gid in ("eval3.1", "", "g", "g-1", "x5", "g5x"):
        assert gid not in seen
        with pytest.raises(ValueError, match="not g<cursor>"):
            seen.add(gid)
