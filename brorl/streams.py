"""Work queues on Redis Streams with consumer groups: at-least-once delivery, ack after the
work is durable, recovery of a dead consumer's pending entries (XAUTOCLAIM), a lease that a
live consumer renews while it works (so a long job is not mistaken for a dead one), a
dead-letter stream after too many deliveries, and a bounded stream length.

Payloads are serialized protobuf messages stored under the field ``data``; never pickle.
brorl.queue names the streams of a run and hands out these queues.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Delivery:
    entry_id: str
    data: bytes
    deliveries: int  # how many times this entry has been handed out (1 on first read)


# Atomically: publish the result once per job id, then ack and delete the job. A worker that
# dies after this script leaves nothing pending; one that dies before it leaves the job to be
# reclaimed. The done set is a sorted set scored by time and trimmed to the last ARGV[6]
# seconds: a duplicate can only come from a job reclaimed while its first worker still ran,
# within minutes, and the learner drops any later one by group id — so it never grows with
# the run.
_PUBLISH_ONCE = """
local now = tonumber(redis.call('TIME')[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[6]))
local fresh = redis.call('ZADD', KEYS[1], 'NX', now, ARGV[1])
if fresh == 1 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'data', ARGV[2])
end
redis.call('XACK', KEYS[3], ARGV[3], ARGV[5])
redis.call('XDEL', KEYS[3], ARGV[5])
return fresh
"""

DONE_WINDOW_S = 3600  # how long a published job id is remembered (see _PUBLISH_ONCE)


# Reset an entry's idle time if (and only if) this consumer still owns it: XCLAIM with JUSTID
# neither returns the payload nor counts a delivery. Checked and claimed in one script so a
# consumer that was presumed dead never takes an entry back from the one that reclaimed it.
# 1: renewed; 0: another consumer owns it; -1: pending nowhere (acked: its result is published).
_RENEW = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if p[1] == nil then
  return -1
end
if p[1][2] ~= ARGV[2] then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
"""


# A consumer that never takes over another's entries (the learner: the paths stream's only
# consumer, whose un-acked parts wait in its assembler on purpose).
NEVER_RECLAIM_MS = 2**31 - 1


class StreamQueue:
    """One stream read by one consumer group.

    ``claim_idle_ms``: entries pending that long on another consumer are taken over (that
    consumer is presumed dead); by default never (the rollout workers pass their config's
    ``claim_idle_ms``). ``max_deliveries``: an entry handed out more often than this
    goes to the dead-letter stream instead of being processed again.
    """

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        group: str,
        *,
        consumer: str | None = None,
        dead_stream: str | None = None,
        maxlen: int = 100_000,
        claim_idle_ms: int = NEVER_RECLAIM_MS,
        max_deliveries: int = 5,
    ):
        self.r = client
        self.stream = stream
        self.group = group
        self.consumer = consumer or consumer_name()
        self.dead_stream = dead_stream
        self.maxlen = maxlen
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self._publish_once = self.r.register_script(_PUBLISH_ONCE)
        self._renew = self.r.register_script(_RENEW)
        self.ensure_group()

    def ensure_group(self) -> None:
        try:
            self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- producing ---------------------------------------------------------------------------
    def put(self, data: bytes) -> str:
        entry = self.r.xadd(self.stream, {"data": data}, maxlen=self.maxlen, approximate=True)
        return entry.decode() if isinstance(entry, bytes) else entry

    def put_many(self, items: list[bytes]) -> list[str]:
        """Append ``items`` in one MULTI/EXEC: a consumer blocked on the stream wakes to all of
        them, not to the first alone (Redis serves blocked readers after the transaction), so a
        rollout worker can fill one engine call with a step's jobs."""
        if not items:
            return []
        pipe = self.r.pipeline(transaction=True)
        for data in items:
            pipe.xadd(self.stream, {"data": data}, maxlen=self.maxlen, approximate=True)
        return [_s(entry) for entry in pipe.execute()]

    # -- consuming ---------------------------------------------------------------------------
    def read(self, count: int = 1, block_ms: int | None = 1000) -> list[Delivery]:
        """Reclaimed entries of dead consumers first, then new ones; blocks up to ``block_ms``
        when there are none (None: returns at once)."""
        if block_ms is not None and block_ms <= 0:
            raise ValueError("block_ms must be positive or None (Redis reads BLOCK 0 as forever)")
        out = self._reclaim(count)
        if len(out) < count:
            resp = self.r.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: ">"},
                count=count - len(out),
                block=None if out else block_ms,
            )
            for _stream, entries in resp or []:
                for entry_id, fields in entries:
                    if fields and b"data" in fields:
                        out.append(Delivery(_s(entry_id), fields[b"data"], 1))
                    else:  # trimmed away while pending: nothing to do but ack
                        self.ack(_s(entry_id))
        return out

    def take_over(self, count: int = 10_000) -> list[Delivery]:
        """Claim every pending entry of the group now, whatever its idle time: for a consumer
        that replaces a dead one and is the group's only member (the learner after a restart)."""
        return self._reclaim(count, min_idle_ms=0)

    def _reclaim(self, count: int, min_idle_ms: int | None = None) -> list[Delivery]:
        idle = self.claim_idle_ms if min_idle_ms is None else min_idle_ms
        resp = self.r.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=idle, start_id="0-0", count=count
        )
        claimed = resp[1] if resp else []
        out: list[Delivery] = []
        for entry_id, fields in claimed:
            entry_id = _s(entry_id)
            if not fields or b"data" not in fields:
                self.ack(entry_id)
                continue
            deliveries = self._delivery_count(entry_id)
            if deliveries > self.max_deliveries:
                self.dead_letter(entry_id, fields[b"data"], f"delivered {deliveries} times")
                continue
            log.warning(
                "reclaimed %s from a consumer silent for %d ms or more (delivery %d)",
                entry_id,
                idle,
                deliveries,
            )
            out.append(Delivery(entry_id, fields[b"data"], deliveries))
        return out

    def _delivery_count(self, entry_id: str) -> int:
        info = self.r.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
        return int(info[0]["times_delivered"]) if info else 1

    def renew(self, entry_id: str) -> bool:
        """Reset ``entry_id``'s idle time; False when this consumer no longer owns it."""
        return self._renew_state(entry_id) == 1

    def _renew_state(self, entry_id: str) -> int:
        """_RENEW's answer: 1 renewed, 0 owned by another consumer, -1 acked."""
        return int(self._renew(keys=[self.stream], args=[self.group, self.consumer, entry_id]))

    @contextlib.contextmanager
    def lease(self, *entry_ids: str, every_s: float | None = None):
        """Renew the entries in a background thread while the body runs (every third of
        ``claim_idle_ms`` by default): other consumers reclaim one only once this one stops
        renewing, i.e. died. Yields the set of entries still held: discard an entry from it
        before acking it, so that its renewal stops without a false alarm. Losing the lease is
        logged; publish_once_and_ack keeps the result single either way."""
        interval = every_s if every_s is not None else self.claim_idle_ms / 3000
        held, done = set(entry_ids), threading.Event()

        def keep() -> None:
            while not done.wait(interval):
                for entry_id in list(held):
                    try:
                        state = self._renew_state(entry_id)
                        if state == 1 or entry_id not in held or done.is_set():
                            continue
                        held.discard(entry_id)
                        if state == 0:  # -1: acked, e.g. by the worker's tail process
                            log.warning(
                                "lost the lease on %s of %s to another consumer",
                                entry_id,
                                self.stream,
                            )
                    except redis.RedisError as exc:  # Redis away for a moment: next tick
                        log.warning("could not renew %s: %s", entry_id, exc)

        thread = threading.Thread(target=keep, name=f"lease-{len(entry_ids)}", daemon=True)
        thread.start()
        try:
            yield held
        finally:
            done.set()
            thread.join()

    def ack(self, entry_id: str) -> None:
        self.r.xack(self.stream, self.group, entry_id)

    def ack_and_delete(self, entry_id: str) -> None:
        """Ack and remove the entry: for a stream whose group is its only reader, so that
        consumed entries do not pile up until MAXLEN trims them."""
        pipe = self.r.pipeline()
        pipe.xack(self.stream, self.group, entry_id)
        pipe.xdel(self.stream, entry_id)
        pipe.execute()

    def dead_letter(self, entry_id: str, data: bytes, reason: str) -> None:
        if self.dead_stream:
            self.r.xadd(
                self.dead_stream,
                {"data": data, "source": self.stream, "reason": reason},
                maxlen=self.maxlen,
                approximate=True,
            )
        self.ack(entry_id)
        log.error("moved %s of %s to the dead-letter stream: %s", entry_id, self.stream, reason)

    def publish_once_and_ack(
        self,
        entry_id: str,
        job_id: str,
        result_stream: str,
        done_set: str,
        data: bytes,
        result_maxlen: int = 100_000,
    ) -> bool:
        """Write ``data`` to ``result_stream`` unless ``job_id`` was already published, and ack
        ``entry_id`` — atomically. Returns False for a duplicate (already published)."""
        fresh = self._publish_once(
            keys=[done_set, result_stream, self.stream],
            args=[job_id, data, self.group, result_maxlen, entry_id, DONE_WINDOW_S],
        )
        return bool(fresh)

    def pending_count(self) -> int:
        return int(self.r.xpending(self.stream, self.group)["pending"])

    def lag(self) -> int:
        """Entries not yet delivered to the group (Redis 7 XINFO GROUPS 'lag')."""
        for g in self.r.xinfo_groups(self.stream):
            if _s(g["name"]) == self.group:
                return int(g.get("lag") or 0)
        return 0


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
