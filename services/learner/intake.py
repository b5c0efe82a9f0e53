"""Taking scored groups off the paths stream for one update.

Rules, in the order they apply to a whole group (fanned-out parts are reassembled first):
a group id seen before is a duplicate (acked, counted, never trained twice); a group sampled
more than ``max_staleness`` versions ago is dropped; a group whose rewards are all equal
carries no signal (every advantage is 0) and is skipped — after ``max_degenerate_streak`` of
those in a row the run fails with a message. Entries of used groups are acked by the caller
once the update that used them is done; everything else is acked here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from brorl.runconfig import AsyncConfig
from brorl.v1 import common_pb2
from services.learner.assembly import GroupAssembler


@dataclass
class Consumed:
    group: common_pb2.PathGroup
    staleness: int  # learner version − the group's (oldest part's) version
    outcome: str  # "used" | "stale" | "degenerate"


@dataclass
class Intake:
    """What one step took off the stream."""

    consumed: list[Consumed] = field(default_factory=list)  # every whole group, in arrival order
    entries: list[str] = field(default_factory=list)  # stream entries of the used groups
    duplicate_groups: int = 0  # deliveries of a group already consumed
    duplicate_parts: int = 0  # a part delivered twice while its group was being reassembled

    @property
    def groups(self) -> list[common_pb2.PathGroup]:
        return [c.group for c in self.consumed if c.outcome == "used"]


class GroupIntake:
    """Owns the consumer side of the paths stream: reassembly, idempotency and drop rules.
    ``consumed`` (groups taken, used or dropped) and ``seen`` are checkpointed by the trainer."""

    def __init__(self, queue, rules: AsyncConfig, on_consumed: Callable[[], None] = lambda: None):
        self.queue, self.rules, self.on_consumed = queue, rules, on_consumed
        self.assembler = GroupAssembler()
        self.seen: set[str] = set()
        self.consumed = 0
        self.degenerate_streak = 0
        # The learner is the group's only consumer: it takes over a dead predecessor's pending
        # groups once at start, and never reclaims from itself (parts of a fanned-out group
        # wait un-acked in the assembler until their siblings arrive).
        self._backlog = queue.take_over()

    def collect(self, want: int, version: int, stop: threading.Event) -> Intake | None:
        """Read until ``want`` usable groups are in hand; None when ``stop`` is set meanwhile."""
        intake = Intake()
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
            if self._backlog:
                deliveries, self._backlog = self._backlog, []
            else:
                deliveries = self.queue.read(count=max(want - len(intake.groups), 1), block_ms=1000)
            for d in deliveries:
                if self._take(common_pb2.PathGroup.FromString(d.data), d.entry_id, version, intake):
                    deadline = time.monotonic() + timeout
        return intake

    def ack(self, entries: list[str]) -> None:
        for entry in entries:
            self.queue.ack(entry)

    def _take(
        self, part: common_pb2.PathGroup, entry_id: str, version: int, intake: Intake
    ) -> bool:
        """Handle one delivery; True when it completed a group."""
        if part.group_id in self.seen:
            self.queue.ack(entry_id)
            intake.duplicate_groups += 1
            return False
        group, entries, duplicate = self.assembler.add(part, entry_id)
        if duplicate:
            self.queue.ack(entry_id)
            intake.duplicate_parts += 1
        if group is None:
            return False
        self.seen.add(group.group_id)
        self.consumed += 1
        self.on_consumed()
        staleness = version - group.weight_version
        outcome = self._judge(group, staleness)
        intake.consumed.append(Consumed(group, staleness, outcome))
        if outcome == "used":
            intake.entries.extend(entries)
        else:
            self.ack(entries)
        return True

    def _judge(self, group: common_pb2.PathGroup, staleness: int) -> str:
        if staleness > self.rules.max_staleness:
            return "stale"
        rewards = [p.reward for p in group.paths]
        if rewards and max(rewards) != min(rewards):
            self.degenerate_streak = 0
            return "used"
        self.degenerate_streak += 1
        if self.degenerate_streak >= self.rules.max_degenerate_streak:
            raise RuntimeError(
                f"{self.degenerate_streak} groups in a row had all rewards equal (last: "
                f"{rewards[0] if rewards else 'none'}): no learning signal; the task is too hard "
                "or too easy for this policy, or the reward function does not fit the data"
            )
        return "degenerate"
