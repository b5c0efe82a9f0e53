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
    def __init__(self):
        self._parts: dict[str, dict[int, tuple[common_pb2.PathGroup, str]]] = {}

    def add(
        self, part: common_pb2.PathGroup, entry_id: str
    ) -> tuple[common_pb2.PathGroup | None, list[str], bool]:
        """Add one part; returns (whole group or None, entry ids to ack with it, duplicate?)."""
        if part.part_count <= 1:
            return part, [entry_id], False
        held = self._parts.setdefault(part.group_id, {})
        if part.part_index in held:
            return None, [], True
        held[part.part_index] = (part, entry_id)
        if len(held) < part.part_count:
            return None, [], False
        del self._parts[part.group_id]
        ordered = [held[i] for i in sorted(held)]
        return merge_parts([g for g, _ in ordered]), [e for _, e in ordered], False

    @property
    def waiting(self) -> int:
        return len(self._parts)
