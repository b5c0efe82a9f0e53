"""The episodes an environment service holds: each episode's state and the answers it gave, so
that a retried Step (same episode id and turn, a lost reply) is answered again without being
applied twice, and a step out of order is refused.

Bounded: at most ``capacity`` episodes are held (a Reset beyond that is RESOURCE_EXHAUSTED), and
an episode untouched for ``ttl_s`` is forgotten (a worker that died never closes its episodes).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from brorl.errors import FailedPrecondition, NotFound, ResourceExhausted
from envs.base import Environment, Turn


@dataclass
class _Episode:
    state: Any
    observation: str
    turns: list[Turn] = field(default_factory=list)  # the answer to each turn so far
    done: bool = False
    touched: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


class EpisodeTable:
    def __init__(self, env: Environment, capacity: int = 100_000, ttl_s: float = 3600.0):
        self.env, self.capacity, self.ttl_s = env, capacity, ttl_s
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()

    def reset(self, episode_id: str, prompt: str, reference: str, extra: dict, seed: int) -> str:
        """Start ``episode_id`` (again: a retried Reset answers as the first did)."""
        with self._lock:
            held = self._episodes.get(episode_id)
            if held is not None:
                held.touched = time.monotonic()
                return held.observation
            self._evict()
            if len(self._episodes) >= self.capacity:
                raise ResourceExhausted(f"{self.capacity} episodes held; close some first")
        state, observation = self.env.reset(prompt, reference, extra, seed)
        with self._lock:
            self._episodes.setdefault(episode_id, _Episode(state, observation))
            return self._episodes[episode_id].observation

    def step(self, episode_id: str, turn: int, action: str, policy_done: bool) -> Turn:
        episode = self._get(episode_id)
        with episode.lock:
            episode.touched = time.monotonic()
            if 1 <= turn <= len(episode.turns):  # answered before: the same answer
                return episode.turns[turn - 1]
            if turn != len(episode.turns) + 1:
                raise FailedPrecondition(
                    f"episode {episode_id} is at turn {len(episode.turns)}; got turn {turn}"
                )
            if episode.done:
                raise FailedPrecondition(f"episode {episode_id} is done")
            answer = self.env.step(episode.state, turn, action, policy_done)
            limit = self.env.max_turns
            if limit and turn >= limit:
                answer.done = True
            episode.turns.append(answer)
            episode.done = answer.done
            return answer

    def close(self, episode_id: str) -> None:
        with self._lock:
            self._episodes.pop(episode_id, None)

    def __len__(self) -> int:
        return len(self._episodes)

    def _get(self, episode_id: str) -> _Episode:
        with self._lock:
            episode = self._episodes.get(episode_id)
        if episode is None:
            raise NotFound(f"no episode {episode_id} (never reset, closed, or expired)")
        return episode

    def _evict(self) -> None:
        """Forget episodes untouched for ttl_s (under self._lock)."""
        old = time.monotonic() - self.ttl_s
        for key in [k for k, e in self._episodes.items() if e.touched < old]:
            del self._episodes[key]
