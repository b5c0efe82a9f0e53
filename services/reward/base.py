"""What a reward function is: a named object that scores a batch of completions.

Functions know nothing of gRPC; the servicer converts protobuf to ``ScoreItem`` and back.
A function never raises for one bad completion: it returns a ``Score`` with status
"error" / "timeout" / "filtered" and a detail saying why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol
from brorl.contract import RewardStatus


@dataclass
class ScoreItem:
    id: str
    prompt: str
    completion: str
    reference: str
    extra: dict[str, str] = field(default_factory=dict)  # data.fields.extra of the prompt


@dataclass
class Score:
    reward: float
    status: str = RewardStatus.OK  # ok | timeout | error | filtered
    detail: str = ""
    components: dict[str, float] = field(default_factory=dict)
    latency_ms: float = 0.0


class RewardFunction(Protocol):
    name: str
    description: str

    def score_batch(self, items: list[ScoreItem]) -> list[Score]: ...
