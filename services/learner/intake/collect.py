"""Taking scored groups off the paths stream for one update.

Rules, in the order they apply to a whole group (fanned-out parts are reassembled first; a part
given up by the dead-letter watch or overdue by ``part_deadline_s`` no longer waits):
a group id seen before is a duplicate (acked, counted, never trained twice); a group the engine
refused (``error`` set: e.g. a prompt longer than the context) is dropped as ``rejected``;
paths whose reward failed (status in ``excluded_reward_statuses``, or a non-finite reward) are
taken out, and a group left with fewer than 2 paths is dropped as ``reward_failed``; a group
sampled more than ``max_staleness`` versions ago is dropped; a group whose rewards are all
equal carries no signal (every advantage is 0) and is skipped — after
``max_degenerate_streak`` of those in a row the run fails with a message. A group whose every
job was given up is ``lost``. Entries of used groups are acked by the caller once the update
that used them is done; everything else is acked here. Held-out evaluation groups (``eval`` set)
are none of the step's: they are acked and handed to ``on_eval`` as they come.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from google.protobuf.message import DecodeError

from brorl.queue import RedisUnavailable, Stopped, retry_while_down
from brorl.config.run import AsyncConfig
from brorl.v1 import common_pb2
from services.learner.intake.assembly import GroupAssembler
from services.learner.intake.seen_groups import SeenGroups

log = logging.getLogger(__name__)


@dataclass
class Consumed:
    group: common_pb2.PathGroup
    staleness: int  # learner version − the group's (oldest part's) version
    # "used" | "stale" | "degenerate" | "rejected" | "reward_failed" | "too_few_paths" | "lost"
    # | "rolled_back" (sampled by weights a monitor rollback abandoned)
    outcome: str
    excluded: Counter = field(default_factory=Counter)  # paths taken out, by reward status


@dataclass
class Intake:
    """What one step took off the stream."""

    consumed: list[Consumed] = field(default_factory=list)  # every whole group, in arrival order
    entries: list[str] = field(default_factory=list)  # stream entries of the used groups
    duplicate_groups: int = 0  # deliveries of a group already consumed
    duplicate_parts: int = 0  # a part delivered twice while its group was being reassembled
    partial_groups: int = 0  # fanned-out groups completed without every part

    @property
    def groups(self) -> list[common_pb2.PathGroup]:
        return [c.group for c in self.consumed if c.outcome == "used"]


def usable_paths(
    group: common_pb2.PathGroup, excluded_statuses: list[str]
) -> tuple[common_pb2.PathGroup, Counter]:
    """``group`` without the paths whose reward failed (a status in ``excluded_statuses`` or a
    non-finite reward) and the count of those taken out by status; ``group`` itself when none."""
    bad: Counter = Counter()
    keep = []
    for p in group.paths:
        if not math.isfinite(p.reward):
            bad["nonfinite"] += 1
        elif p.reward_status in excluded_statuses:
            bad[p.reward_status] += 1
        else:
            keep.append(p)
    if not bad:
        return group, bad
    out = common_pb2.PathGroup()
    out.CopyFrom(group)
    del out.paths[:]
    out.paths.extend(keep)
    return out, bad


class GroupIntake:
    """Owns the consumer side of the paths stream: reassembly, idempotency and drop rules.
    ``consumed`` (groups taken, used or dropped) and ``seen`` are checkpointed by the trainer.
    ``lost_parts()`` reports jobs given up (services.learner.intake.dead_letters)."""

    def __init__(
        self,
        queue,
        rules: AsyncConfig,
        on_consumed: Callable[[], None] = lambda: None,
        lost_parts: Callable[[], list] = lambda: [],
        on_eval: Callable[[common_pb2.PathGroup], None] = lambda group: None,
    ):
        self.queue, self.rules, self.on_consumed = queue, rules, on_consumed
        self.lost_parts, self.on_eval = lost_parts, on_eval
        self.assembler = GroupAssembler()
        self.seen = SeenGroups()
        self.consumed = 0
        self.degenerate_streak = 0
        self.min_version = 0  # groups sampled by older weights are dropped (a rollback's)
        self._collecting: tuple[int, Intake] | None = None  # (want, intake) while collecting
        # The learner is the group's only consumer: it takes over a dead predecessor's pending
        # groups once at start, and never reclaims from itself (parts of a fanned-out group
        # wait un-acked in the assembler until their siblings arrive).
        self._backlog = queue.take_over()
        self._reread = False  # set after a Redis outage (see _read_some)

    def collect(self, want: int, version: int, stop: threading.Event) -> Intake | None:
        """Read until ``want`` usable groups are in hand; None when ``stop`` is set meanwhile.
        A Redis outage is ridden out (brorl.queue.retry_while_down) and does not count against
        the wait for groups; what was delivered but never seen is read again after it."""
        intake = Intake()
        self._collecting = (want, intake)
        try:
            return self._collect(want, version, stop, intake)
        finally:
            self._collecting = None

    @property
    def needed(self) -> int | None:
        """Usable groups the collect under way still needs (None outside a collect): what the
        job feed's forecast starts from (services/learner/feed/lookahead.py)."""
        if self._collecting is None:
            return None
        want, intake = self._collecting
        return max(want - len(intake.groups), 0)

    def _collect(
        self, want: int, version: int, stop: threading.Event, intake: Intake
    ) -> Intake | None:
        timeout = self.rules.group_timeout_s
        deadline = time.monotonic() + timeout
        while len(intake.groups) < want:
            if stop.is_set():
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no path group for {timeout:.0f}s: are rollout workers and "
                    "the reward service running?"
                )
            outage = []
            try:
                finished = retry_while_down(
                    lambda: self._read_some(want - len(intake.groups), version, intake),
                    self.rules.redis_outage_s,
                    "collecting groups",
                    stop=stop,
                    on_down=lambda: outage.append(self._mark_reread()),
                )
            except Stopped:
                return None
            if finished or outage:
                deadline = time.monotonic() + timeout
        return intake

    def _mark_reread(self) -> None:
        self._reread = True

    def _read_some(self, missing: int, version: int, intake: Intake) -> bool:
        """One read of the stream (and of given-up parts); True when a group was finished."""
        if self._reread:  # after an outage: what was delivered but never seen comes again
            self._backlog = [
                d for d in self.queue.take_over() if not self.assembler.holds(d.entry_id)
            ]
            self._reread = False
        if self._backlog:
            deliveries, self._backlog = self._backlog, []
        else:
            deliveries = self.queue.read(count=max(missing, 1), block_ms=1000)
        finished = False
        for d in deliveries:
            finished = self._take_delivery(d, version, intake) or finished
        return self._settle_missing(version, intake) or finished

    def drain_eval(self, done: Callable[[], bool], timeout_s: float, stop: threading.Event) -> None:
        """At the end of a run: read until ``done()`` (the evaluation rounds are complete), the
        timeout, or ``stop``. Training groups read meanwhile stay un-acked; the run's keys
        expire with them."""
        deadline = time.monotonic() + timeout_s
        while not done() and not stop.is_set() and time.monotonic() < deadline:
            try:
                retry_while_down(
                    self._read_eval,
                    self.rules.redis_outage_s,
                    "reading evaluation groups",
                    stop=stop,
                )
            except Stopped:
                return
            except RedisUnavailable as exc:  # the run ends without its last round's groups
                log.warning("evaluation groups not read: %s", exc)
                return

    def _read_eval(self) -> None:
        for d in self.queue.read(count=16, block_ms=500):
            part = self._decode(d)
            if part is not None and part.eval:
                self.ack([d.entry_id])
                self.on_eval(part)

    def ack(self, entries: list[str]) -> None:
        for entry in entries:
            self.queue.ack_and_delete(entry)

    def _decode(self, d) -> common_pb2.PathGroup | None:
        try:
            return common_pb2.PathGroup.FromString(d.data)
        except DecodeError as exc:
            self.queue.dead_letter(d.entry_id, d.data, f"not a PathGroup: {exc}")
            return None

    def _take_delivery(self, d, version: int, intake: Intake) -> bool:
        part = self._decode(d)
        if part is None:
            return False
        if part.eval:
            self.ack([d.entry_id])
            self.on_eval(part)
            return False
        return self._take(part, d.entry_id, version, intake)

    def _take(
        self, part: common_pb2.PathGroup, entry_id: str, version: int, intake: Intake
    ) -> bool:
        """Handle one delivery; True when it completed a group."""
        if part.group_id in self.seen:
            self.ack([entry_id])
            intake.duplicate_groups += 1
            return False
        group, entries, duplicate = self.assembler.add(part, entry_id, time.monotonic())
        if duplicate:
            self.ack([entry_id])
            intake.duplicate_parts += 1
        if group is None:
            return False
        self._finish(group, entries, version, intake)
        return True

    def _settle_missing(self, version: int, intake: Intake) -> bool:
        """Finish groups with a part given up or overdue; True when one was finished."""
        finished = False
        for lost in self.lost_parts():
            if lost.group_id in self.seen:
                continue
            group, entries, done = self.assembler.give_up(
                lost.group_id, lost.part_index, lost.part_count
            )
            if group is not None:
                intake.partial_groups += 1
                self._finish(group, entries, version, intake)
            elif done:  # nothing of the group arrived
                self._finish(
                    common_pb2.PathGroup(group_id=lost.group_id),
                    [],
                    version,
                    intake,
                    outcome="lost",
                )
            finished = finished or done
        for group_id in self.assembler.overdue(self.rules.part_deadline_s, time.monotonic()):
            group, entries = self.assembler.take_partial(group_id)
            if group is not None:
                log.warning(
                    "group %s completed from %d paths after the part deadline",
                    group_id,
                    len(group.paths),
                )
                intake.partial_groups += 1
                self._finish(group, entries, version, intake)
                finished = True
        return finished

    def _finish(self, group, entries, version, intake: Intake, outcome: str = "") -> None:
        self.seen.add(group.group_id)
        self.consumed += 1
        staleness = version - group.weight_version
        group, excluded = usable_paths(group, self.rules.excluded_reward_statuses)
        if not outcome and not group.error and len(group.paths) < 2:
            outcome = "reward_failed" if excluded else "too_few_paths"
        outcome = outcome or self._judge(group, staleness)
        intake.consumed.append(Consumed(group, staleness, outcome, excluded))
        if outcome == "used":
            intake.entries.extend(entries)
        else:
            self.ack(entries)
        self.on_consumed()  # room for a group: the feed sends more (it reads ``needed``)

    def _judge(self, group: common_pb2.PathGroup, staleness: int) -> str:
        if group.error:
            return "rejected"
        if staleness > self.rules.max_staleness:
            return "stale"
        if group.weight_version < self.min_version:
            return "rolled_back"
        rewards = [p.reward for p in group.paths]
        if max(rewards) != min(rewards):
            self.degenerate_streak = 0
            return "used"
        self.degenerate_streak += 1
        if self.degenerate_streak >= self.rules.max_degenerate_streak:
            raise RuntimeError(
                f"{self.degenerate_streak} groups in a row had all rewards equal (last: "
                f"{rewards[0]}): no learning signal; the task is too hard "
                "or too easy for this policy, or the reward function does not fit the data"
            )
        return "degenerate"
