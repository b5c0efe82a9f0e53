"""In-memory stand-ins for brorl.queue's StreamQueue / RunChannels / RunRegistry, for unit
tests of the loops that are about their own rules (the Redis path is covered by
tests/unit/brorl/test_queue.py and the e2e tests). Same at-least-once semantics: an entry read and
not acked stays pending and comes back from ``take_over``."""

from __future__ import annotations

import contextlib
import itertools
import queue
from typing import Callable

from brorl.queue import DeadLetter, Delivery
from brorl.v1 import common_pb2


class MemoryStreamQueue:
    def __init__(
        self,
        on_empty: Callable[[], None] = lambda: None,
        name: str = "stream",
        dead_sink: list | None = None,
    ):
        self.name = name
        self.dead_sink = dead_sink if dead_sink is not None else []  # the run's dead letters
        self.entries: dict[str, bytes] = {}  # every entry put, by id
        self.new: list[str] = []  # not yet delivered
        self.pending: dict[str, int] = {}  # delivered, not acked → deliveries
        self.acked: set[str] = set()
        self.dead: list[tuple[str, str]] = []  # (entry id, reason)
        self.on_empty = on_empty  # e.g. a fake rollout that answers pending jobs
        self._ids = itertools.count(1)

    def put(self, data: bytes) -> str:
        entry = f"{next(self._ids)}-0"
        self.entries[entry] = data
        self.new.append(entry)
        return entry

    def put_many(self, items: list[bytes]) -> list[str]:
        return [self.put(data) for data in items]

    def read(self, count: int = 1, block_ms: int | None = 1000) -> list[Delivery]:
        if not self.new:
            self.on_empty()
        taken, self.new = self.new[:count], self.new[count:]
        for e in taken:
            self.pending[e] = self.pending.get(e, 0) + 1
        return [Delivery(e, self.entries[e], self.pending[e]) for e in taken]

    @contextlib.contextmanager
    def lease(self, *entry_ids: str):
        yield set(entry_ids)  # nothing here reclaims idle entries, so there is nothing to renew

    def take_over(self, count: int = 10_000) -> list[Delivery]:
        return [Delivery(e, self.entries[e], n) for e, n in list(self.pending.items())[:count]]

    def ack(self, entry_id: str) -> None:
        self.pending.pop(entry_id, None)
        self.acked.add(entry_id)

    def ack_and_delete(self, entry_id: str) -> None:
        self.ack(entry_id)
        self.entries.pop(entry_id, None)

    def dead_letter(self, entry_id: str, data: bytes, reason: str) -> None:
        self.dead.append((entry_id, reason))
        self.dead_sink.append(DeadLetter(f"{len(self.dead_sink) + 1}-0", self.name, reason, data))
        self.ack(entry_id)


class MemoryChannels:
    """RunChannels of one run in memory; ``rollout`` answers pending prompt jobs when the
    learner finds the paths stream empty."""

    def __init__(self, run_id: str, rollout: Callable[["MemoryChannels"], None] = lambda c: None):
        self.run_id = run_id
        self.dead: list[DeadLetter] = []
        self.prompts = MemoryStreamQueue(name="prompts", dead_sink=self.dead)
        self.paths = MemoryStreamQueue(
            on_empty=lambda: rollout(self), name="paths", dead_sink=self.dead
        )
        self.expired_after: int | None = None
        self.pointers: list[common_pb2.WeightVersion] = []
        self.listeners: list = []  # weight_announcements subscribers
        self.done: set[str] = set()

    def prompt_queue(self, **options) -> MemoryStreamQueue:
        return self.prompts

    def path_queue(self, **options) -> MemoryStreamQueue:
        return self.paths

    def publish_group(self, prompt_queue, entry_id: str, job_id: str, data: bytes) -> bool:
        fresh = job_id not in self.done
        if fresh:
            self.done.add(job_id)
            self.paths.put(data)
        prompt_queue.ack(entry_id)
        return fresh

    def read_dead(self, after: str = "0-0", count: int = 100) -> tuple[str, list[DeadLetter]]:
        start = int(after.split("-")[0])
        letters = self.dead[start : start + count]
        return (letters[-1].entry_id if letters else after), letters

    def last_dead_id(self) -> str:
        return self.dead[-1].entry_id if self.dead else "0-0"

    def is_prompt_stream(self, stream: str) -> bool:
        return stream == "prompts"

    def clear_prompts(self) -> None:
        self._clear(self.prompts)

    def clear_paths(self) -> None:
        self._clear(self.paths)

    @staticmethod
    def _clear(stream: MemoryStreamQueue) -> None:
        for e in stream.new:
            stream.entries.pop(e, None)
        stream.new = []

    def expire(self, seconds: int) -> None:
        self.expired_after = seconds

    def publish_weights(self, pointer: common_pb2.WeightVersion) -> None:
        self.pointers.append(pointer)
        for listener in self.listeners:
            listener.put(pointer)

    def weight_announcements(self) -> "MemoryAnnouncements":
        self.listeners.append(listener := MemoryAnnouncements(self.listeners))
        return listener

    def read_weights(self) -> common_pb2.WeightVersion | None:
        return self.pointers[-1] if self.pointers else None


class MemoryAnnouncements(queue.Queue):
    """RunChannels.weight_announcements in memory."""

    def __init__(self, listeners: list):
        super().__init__()
        self.listeners = listeners

    def next(self, timeout_s: float) -> common_pb2.WeightVersion | None:
        try:
            return self.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.listeners.remove(self)


class MemoryRegistry:
    def __init__(self):
        self.run = ""

    def announce(self, run_id: str) -> None:
        self.run = run_id

    def active(self) -> str:
        return self.run

    def retire(self, run_id: str) -> None:
        if self.run == run_id:
            self.run = ""
