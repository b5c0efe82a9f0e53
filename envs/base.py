"""What an environment is, as brorl's Python EnvironmentService hosts it (envs/server.py): a
class with ``reset`` and ``step`` over its own per-episode state. Any other language implements
protos/brorl/v1/environment.proto directly (examples/node_env/ does, from the .proto alone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Turn:
    """An environment's answer to one policy turn."""

    observation: str = ""  # what the policy reads next ("" when done)
    reward: float = 0.0  # this turn's reward
    done: bool = False
    info: dict[str, str] = field(default_factory=dict)


class Environment(Protocol):
    name: str
    version: str
    max_turns: int  # the environment's own bound on policy turns (0: none)
    description: str

    def reset(self, prompt: str, reference: str, extra: dict[str, str], seed: int) -> tuple:
        """A new episode's state and the observation before the policy's first turn."""

    def step(self, state: Any, turn: int, action: str, policy_done: bool) -> Turn:
        """The policy's turn ``turn`` (1, 2, ...): its text; ``policy_done`` when it ended with
        its end-of-sequence token. ``state`` may be changed in place."""
