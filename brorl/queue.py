"""The Redis side of a run: its keys, its channels (prompt jobs, scored groups, dead letters,
the weight pointer), the registry of active runs, and connecting to Redis and riding out its
outages. The queues themselves are brorl.streams."""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import redis

from brorl.contract import ConsumerGroup, KeyName
from brorl.streams import Delivery, StreamQueue, _s, consumer_name
from brorl.v1 import common_pb2

__all__ = ["Delivery", "StreamQueue", "consumer_name"]

log = logging.getLogger(__name__)

# Which consumer group reads each stream of a run.
CONSUMERS = {"prompts": ConsumerGroup.ROLLOUT, "paths": ConsumerGroup.LEARNER}


def keys(run_id: str, *, namespace: str) -> dict[str, str]:
    """The Redis keys of one run of one cluster namespace (docs/design.md "Redis keys"): two
    clusters sharing a Redis may reuse a run id without touching each other's streams."""
    for what, name in (("namespace", namespace), ("run id", run_id)):
        if not KeyName.fits(name):
            raise ValueError(f"{what} {name!r}: {KeyName.RULE}")
    base = f"brorl:{namespace}:{run_id}"
    return {
        name: f"{base}:{name}"
        for name in ("prompts", "paths", "weights", "dead", "done", "metrics")
    }


def active_run_key(namespace: str) -> str:
    """Where a learner announces its current run to the rollout workers of its namespace:
    clusters sharing one Redis stay apart by using different namespaces."""
    return f"brorl:active_run:{namespace}"


class RunRegistry:
    """Which run the learner of a namespace is training: its rollout workers follow it."""

    def __init__(self, client: redis.Redis, namespace: str):
        self.r, self.key = client, active_run_key(namespace)

    def announce(self, run_id: str) -> None:
        self.r.set(self.key, run_id)

    def active(self) -> str:
        raw = self.r.get(self.key)
        return raw.decode() if raw else ""

    def retire(self, run_id: str) -> None:
        """Clear the announcement if it is still ``run_id``'s (a newer run keeps its own)."""
        if self.active() == run_id:
            self.r.delete(self.key)


def lease_key(namespace: str) -> str:
    """Held by the learner that trains a run in the namespace (NamespaceLease)."""
    return f"brorl:learner:{namespace}"


# KEYS: lease; ARGV: holder, lease ms. Takes or renews the lease for the holder unless another
# holds it; returns '' or the other holder.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ''
"""
# KEYS: lease; ARGV: holder. Drops the lease if it is still the holder's.
_LET_GO = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


class NamespaceLease:
    """One learner at a time trains in a namespace. Its workers follow the run the namespace's
    learner announces (RunRegistry), so a second learner's run would take them from the first
    one's, which would then wait for groups until ``async.group_timeout_s`` and fail without
    saying why. A learner holds this lease from StartRun to its run's end and renews it every
    third of ``lease_s``; one that dies lets it lapse within ``lease_s``."""

    def __init__(self, client: redis.Redis, namespace: str, holder: str, lease_s: float = 15.0):
        self.r, self.key, self.holder, self.lease_s = client, lease_key(namespace), holder, lease_s
        self._stop = threading.Event()
        self._renewing: threading.Thread | None = None

    def take(self) -> str:
        """Take the lease and keep renewing it until ``release``; '' when taken, else the
        holder that keeps it. Waits up to one lease for another holder's to lapse (a learner
        that died; a live one renews it)."""
        deadline = time.monotonic() + self.lease_s + 1.0
        while (other := self._try()) and time.monotonic() < deadline:
            time.sleep(min(0.5, self.lease_s / 10))
        if other:
            return other
        if self._renewing is None:
            self._stop.clear()
            self._renewing = threading.Thread(target=self._renew, name="lease", daemon=True)
            self._renewing.start()
        return ""

    def release(self) -> None:
        """Stop renewing and drop the lease if it is still this holder's."""
        if self._renewing is not None:
            self._stop.set()
            self._renewing.join()
            self._renewing = None
        try:
            self._let_go(keys=[self.key], args=[self.holder])
        except redis.RedisError as exc:  # it lapses on its own
            log.warning("namespace lease not released (%s): it lapses in %.0f s", exc, self.lease_s)

    @functools.cached_property
    def _hold(self):  # made on first use: a learner built without Redis (tests) never takes it
        return self.r.register_script(_HOLD)

    @functools.cached_property
    def _let_go(self):
        return self.r.register_script(_LET_GO)

    def _try(self) -> str:
        return _s(self._hold(keys=[self.key], args=[self.holder, int(self.lease_s * 1000)]))

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                other = self._try()
            except redis.RedisError as exc:  # renewed again once Redis answers
                log.warning("namespace lease not renewed: %s", exc)
                continue
            if other:  # lapsed during an outage, and another learner took the namespace
                log.error("%s: held by %s now, whose run the workers follow", self.key, other)


class RunChannels:
    """The streams and pointers of one run, so that no key string leaves this module."""

    def __init__(self, client: redis.Redis, run_id: str, *, namespace: str):
        self.r, self.run_id = client, run_id
        self.namespace, self.keys = namespace, keys(run_id, namespace=namespace)

    def prompt_queue(self, **options) -> "StreamQueue":
        """Prompt jobs, consumed by the rollout workers (brorl.contract.ConsumerGroup.ROLLOUT)."""
        return self._queue("prompts", **options)

    def path_queue(self, **options) -> "StreamQueue":
        """Scored path groups, consumed by the learner (ConsumerGroup.LEARNER)."""
        return self._queue("paths", **options)

    def _queue(self, stream: str, **options) -> "StreamQueue":
        return StreamQueue(
            self.r,
            self.keys[stream],
            CONSUMERS[stream],
            dead_stream=self.keys["dead"],
            **options,
        )

    def publish_group(
        self, prompt_queue: "StreamQueue", entry_id: str, job_id: str, data: bytes
    ) -> bool:
        """Publish a job's scored group once per job id and ack the job, atomically."""
        return prompt_queue.publish_once_and_ack(
            entry_id, job_id, self.keys["paths"], self.keys["done"], data
        )

    def read_dead(self, after: str = "0-0", count: int = 100) -> tuple[str, list[DeadLetter]]:
        """Dead letters after entry ``after`` (non-blocking); returns (last id read, letters)."""
        resp = self.r.xread({self.keys["dead"]: after}, count=count)
        letters = []
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                after = _s(entry_id)
                letters.append(
                    DeadLetter(
                        after,
                        _s(fields.get(b"source", b"")),
                        _s(fields.get(b"reason", b"")),
                        fields.get(b"data", b""),
                    )
                )
        return after, letters

    def last_dead_id(self) -> str:
        """The newest dead letter's id ("0-0" when there is none): read after it to see only
        what is dead-lettered from now on."""
        newest = self.r.xrevrange(self.keys["dead"], count=1)
        return _s(newest[0][0]) if newest else "0-0"

    def stream_stats(self) -> dict[str, dict[str, int]]:
        """The prompt and path streams, each with its consuming group (``CONSUMERS``):
        ``length`` entries in the stream (XLEN), ``pending`` delivered but not yet acked, ``lag``
        not yet delivered (XINFO GROUPS). Consumed entries are deleted, so when Redis cannot
        tell the lag (deletions inside the group's range) it is length - pending."""
        return {name: self._stream_stat(name) for name in CONSUMERS}

    def prompt_backlog(self) -> int:
        """Prompt jobs waiting for a worker or being sampled (not yet acked): 0 when the run's
        workers have nothing to do."""
        stat = self._stream_stat("prompts")
        return stat["pending"] + stat["lag"]

    def _stream_stat(self, name: str) -> dict[str, int]:
        key, group = self.keys[name], CONSUMERS[name]
        length = int(self.r.xlen(key))
        try:
            info = [g for g in self.r.xinfo_groups(key) if _s(g["name"]) == group]
        except redis.ResponseError:  # no stream yet
            info = []
        pending = int(info[0]["pending"]) if info else 0
        lag = info[0].get("lag") if info else length
        return {
            "length": length,
            "pending": pending,
            "lag": int(lag) if lag is not None else max(length - pending, 0),
        }

    def is_prompt_stream(self, stream: str) -> bool:
        return stream == self.keys["prompts"]

    def clear_prompts(self) -> None:
        """Drop every queued prompt job (a resumed learner re-sends what it still needs)."""
        self.r.xtrim(self.keys["prompts"], maxlen=0)

    def clear_paths(self) -> None:
        """Drop every scored group not yet consumed (a new run under an earlier run's id)."""
        self.r.xtrim(self.keys["paths"], maxlen=0)

    def expire(self, seconds: int) -> None:
        """Let every key of the run expire ``seconds`` from now (called when the run ends)."""
        for key in self.keys.values():
            self.r.expire(key, seconds)

    def publish_weights(self, pointer: common_pb2.WeightVersion) -> None:
        """Point the run's workers at a committed weight version, and announce it to those
        listening (``weight_announcements``: a worker stages it while its engine samples)."""
        raw = pointer.SerializeToString()
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.keys["weights"], raw)
        pipe.publish(self.keys["weights"], raw)
        pipe.execute()

    def weight_announcements(self) -> "Announcements":
        """The pointers ``publish_weights`` announces from now on. An announcement can be
        missed (a reconnect): the pointer key read by ``read_weights`` stays the truth."""
        return Announcements(self.r, self.keys["weights"])

    def read_weights(self) -> common_pb2.WeightVersion | None:
        raw = self.r.get(self.keys["weights"])
        return common_pb2.WeightVersion.FromString(raw) if raw else None


class Announcements:
    """A subscription to a run's announced weight pointers (Redis pub/sub)."""

    def __init__(self, r: redis.Redis, channel: str):
        self._sub = r.pubsub(ignore_subscribe_messages=True)
        self._sub.subscribe(channel)

    def next(self, timeout_s: float) -> common_pb2.WeightVersion | None:
        """The next pointer announced within ``timeout_s`` (the wait holds no GIL), or None."""
        msg = self._sub.get_message(timeout=timeout_s)
        return common_pb2.WeightVersion.FromString(msg["data"]) if msg else None

    def close(self) -> None:
        self._sub.close()


class RedisUnavailable(ConnectionError):
    """Redis cannot be reached (at start, or for longer than a service's outage budget)."""


# What a Redis outage looks like to a client: refused/reset connections, timeouts, and a
# restarted server still loading its AOF (BusyLoadingError is a ConnectionError).
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)


def connect(url: str) -> redis.Redis:
    """A client of ``url``, checked now: RedisUnavailable names the address when it is down."""
    client = redis.Redis.from_url(
        url, socket_timeout=30, socket_connect_timeout=5, health_check_interval=30
    )
    try:
        client.ping()
    except REDIS_DOWN as exc:
        raise RedisUnavailable(
            f"Redis at {url} is unreachable ({exc}); start redis-server there or set redis_url "
            "to a running one"
        ) from None
    return client


class Stopped(Exception):
    """A retry while Redis was down ended because its caller's stop event was set."""


def retry_while_down(
    fn,
    outage_s: float,
    what: str = "a Redis call",
    *,
    stop: threading.Event | None = None,
    on_down: Callable[[], None] | None = None,
):
    """``fn()``, retried with backoff while Redis is down (restarting, unreachable); raises
    RedisUnavailable once it has been down for ``outage_s``. For idempotent calls only — an
    XADD whose reply was lost is sent twice, which publish-once and the learner's seen groups
    absorb. ``on_down`` runs after every failed try (e.g. to re-read what was delivered);
    with ``stop``, the waits end when it is set, raising Stopped."""
    deadline, delay = None, 0.2
    while True:
        try:
            return fn()
        except REDIS_DOWN as exc:
            now = time.monotonic()
            deadline = deadline or now + outage_s
            if now > deadline:
                raise RedisUnavailable(
                    f"Redis unreachable for {outage_s:.0f}s during {what}: {exc}"
                ) from None
            log.warning("Redis down during %s (%s); retrying", what, exc)
            if on_down is not None:
                on_down()
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                raise Stopped(what) from None
            delay = min(delay * 2, 2.0)


@dataclass
class DeadLetter:
    entry_id: str
    source: str  # the stream the entry was dead-lettered from
    reason: str
    data: bytes
