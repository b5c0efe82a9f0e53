"""The set of group ids the learner has consumed, in memory bounded by the groups in flight.

Group ids are ``g<cursor>`` (services/learner/feed/ids.py): the learner consumes cursors roughly in
order, so the set is kept as a watermark (every cursor below it was consumed) plus the few
consumed cursors above it. A run of a million groups holds a handful of numbers, and so does
its checkpoint.
"""

from __future__ import annotations

from services.learner.feed.ids import cursor_of


class SeenGroups:
    def __init__(self, watermark: int = 0, above: list[int] | None = None):
        self.watermark = watermark  # every cursor < watermark was consumed
        self.above: set[int] = set()  # consumed cursors >= watermark
        for c in above or []:
            self._add(c)

    def __contains__(self, group_id: str) -> bool:
        try:
            c = cursor_of(group_id)
        except ValueError:
            return False
        return c < self.watermark or c in self.above

    def add(self, group_id: str) -> None:
        self._add(cursor_of(group_id))

    def _add(self, c: int) -> None:
        if c < self.watermark:
            return
        self.above.add(c)
        while self.watermark in self.above:
            self.above.remove(self.watermark)
            self.watermark += 1

    def missing(self, cursor: int) -> list[int]:
        """Cursors below ``cursor`` not consumed: the groups in flight when ``cursor`` groups
        had been enqueued."""
        return [c for c in range(self.watermark, cursor) if c not in self.above]

    def __len__(self) -> int:
        return self.watermark + len(self.above)

    def state(self) -> dict:
        return {"watermark": self.watermark, "above": sorted(self.above)}

    @classmethod
    def from_state(cls, state: dict) -> "SeenGroups":
        return cls(int(state["watermark"]), [int(c) for c in state["above"]])
