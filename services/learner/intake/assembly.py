"""Reassembly of fanned-out groups: a wide group (e.g. N=1024) can be sampled as several
prompt jobs (parts) by different workers; the learner trains on it only once every part is in,
and exactly once, keyed by group id."""

from __future__ import annotations

from collections import Counter

from brorl.v1 import common_pb2


def merge_parts(parts: list[common_pb2.PathGroup]) -> common_pb2.PathGroup:
    """One group from its parts (in part order). Its weight version is the oldest part's, so
    the staleness bound holds for every path; generated/dropped add up; stats are averaged
    weighted by the paths each part generated."""
    parts = sorted(parts, key=lambda p: p.part_index)
    first = parts[0]
    merged = common_pb2.PathGroup(
        run_id=first.run_id,
        group_id=first.group_id,
        prompt_id=first.prompt_id,
        prompt=first.prompt,
        prompt_token_ids=first.prompt_token_ids,
        reference=first.reference,
        weight_version=min(p.weight_version for p in parts),
        worker=",".join(sorted({p.worker for p in parts})),
        generate_seconds=sum(p.generate_seconds for p in parts),
        score_seconds=sum(p.score_seconds for p in parts),
        part_index=0,
        part_count=1,
        generated=sum(p.generated for p in parts),
    )
    dropped: Counter = Counter()
    stats: Counter = Counter()
    for p in parts:
        merged.paths.extend(p.paths)
        dropped.update(dict(p.dropped))
        for k, v in p.stats.items():
            stats[k] += v * max(p.generated, 1)
    total = sum(max(p.generated, 1) for p in parts)
    merged.dropped.update(dict(dropped))
    merged.stats.update({k: v / total for k, v in stats.items()})
    return merged


class GroupAssembler:
    """Holds the parts of fanned-out groups until every part is in, or accounted for: a part
    given up (dead-lettered, see dead_letters.py) no longer waits, and a group whose first part
    came ``deadline`` seconds ago is completed from the parts that arrived (``overdue``)."""

    def __init__(self):
        self._parts: dict[str, dict[int, tuple[common_pb2.PathGroup, str]]] = {}
        self._missing: dict[str, set[int]] = {}  # given-up parts, by group
        self._since: dict[str, float] = {}  # when the group's first part arrived

    def add(
        self, part: common_pb2.PathGroup, entry_id: str, now: float = 0.0
    ) -> tuple[common_pb2.PathGroup | None, list[str], bool]:
        """Add one part; returns (whole group or None, entry ids to ack with it, duplicate?)."""
        if part.part_count <= 1:
            return part, [entry_id], False
        held = self._parts.setdefault(part.group_id, {})
        self._since.setdefault(part.group_id, now)
        if part.part_index in held or part.part_index in self._missing.get(part.group_id, ()):
            return None, [], True
        held[part.part_index] = (part, entry_id)
        group, entries = self._complete(part.group_id, part.part_count)
        return group, entries, False

    def give_up(
        self, group_id: str, part_index: int, part_count: int
    ) -> tuple[common_pb2.PathGroup | None, list[str], bool]:
        """A part will never come. Returns (the group, if its other parts are all in; entry ids;
        True when the group is finished — possibly with no part at all)."""
        if part_count <= 1:
            return None, [], True
        self._missing.setdefault(group_id, set()).add(part_index)
        self._parts.setdefault(group_id, {})
        group, entries = self._complete(group_id, part_count)
        return group, entries, group_id not in self._parts

    def overdue(self, deadline_s: float, now: float) -> list[str]:
        """Groups whose first part arrived more than ``deadline_s`` ago and are still waiting."""
        return [g for g, t in self._since.items() if g in self._parts and now - t > deadline_s]

    def take_partial(self, group_id: str) -> tuple[common_pb2.PathGroup | None, list[str]]:
        """Finish ``group_id`` with the parts that arrived (None when none did)."""
        held = self._parts.pop(group_id, {})
        self._missing.pop(group_id, None)
        self._since.pop(group_id, None)
        if not held:
            return None, []
        ordered = [held[i] for i in sorted(held)]
        return merge_parts([g for g, _ in ordered]), [e for _, e in ordered]

    def holds(self, entry_id: str) -> bool:
        return any(e == entry_id for held in self._parts.values() for _, e in held.values())

    def _complete(self, group_id: str, part_count: int):
        held = self._parts[group_id]
        if len(held) + len(self._missing.get(group_id, ())) < part_count:
            return None, []
        return self.take_partial(group_id)

    @property
    def waiting(self) -> int:
        return len(self._parts)
