"""Who published each job's path group, as Redis executed it (MONITOR).

A job's group enters the run's paths stream only through the publish-once script
(brorl/streams.py: ``EVALSHA <sha> 3 <done set> <paths> <prompts> <job id> <group> ...``), whose
XADD runs only when the job id is new to the done set. MONITOR shows every call of it with the
calling client's address and, right after it (a script runs atomically, and MONITOR logs the
commands a script runs as client ``lua``), the XADD when there was one. So every publish is seen,
with the container it came from: reading the paths stream instead missed a group whenever the
learner consumed and deleted it before the reader came by.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

import redis

from brorl import queue as q
from tests.e2e.compose.cluster import NAMESPACE

SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Publish:
    job_id: str
    address: str  # the publishing client's IP (a container's, on the compose network)
    ms: int  # Redis's clock when it ran


class PathAudit:
    def __init__(self, redis_url: str, run_id: str):
        keys = q.keys(run_id, namespace=NAMESPACE)
        # the publish call's numkeys and keys, in the script's order
        self._call = ["3", keys["done"], keys["paths"], keys["prompts"]]
        self._xadd = f"XADD {keys['paths']} "
        self.publishes: list[Publish] = []
        self.attempts = 0  # publish calls, duplicates (no XADD) included
        self.error: Exception | None = None
        self._marks: set[str] = set()
        self._marked = threading.Condition()
        self._redis = redis.Redis.from_url(redis_url)
        self._monitor = self._redis.monitor()
        self._monitor.__enter__()  # sends MONITOR now: nothing after __init__ goes unseen
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        call: tuple[str, str, int] | None = None  # the last publish call, until its XADD shows
        try:
            for line in self._monitor.listen():
                # redis-py joins a command's arguments with spaces; a group's bytes may hold
                # spaces too, so only the arguments before it (up to the job id) are read
                args = line["command"].split(" ", 7)
                if line["client_type"] == "lua":
                    if call and line["command"].startswith(self._xadd):
                        self.publishes.append(Publish(*call))
                    continue
                call = None
                if args[0].upper() == "EVALSHA" and args[2:6] == self._call:
                    self.attempts += 1
                    call = (args[6], line["client_address"], int(line["time"] * 1000))
                elif args[0].upper() == "ECHO" and len(args) > 1:
                    with self._marked:
                        self._marks.add(args[1])
                        self._marked.notify_all()
        except Exception as exc:  # noqa: BLE001 - the cluster went down under it, or close()
            self.error = exc
            with self._marked:
                self._marked.notify_all()

    def settle(self) -> None:
        """Until every command Redis ran before this call has been read (a marker ECHOed
        through another connection comes back through MONITOR after them)."""
        mark = f"audit-{uuid.uuid4().hex}"
        self._redis.echo(mark)
        with self._marked:
            if not self._marked.wait_for(
                lambda: mark in self._marks or self.error, SETTLE_TIMEOUT_S
            ):
                raise AssertionError(f"the MONITOR audit fell {SETTLE_TIMEOUT_S}s behind")
        if self.error:
            raise AssertionError(f"the MONITOR audit stopped: {self.error!r}")

    def of(self, job_id: str) -> list[Publish]:
        return [p for p in self.publishes if p.job_id == job_id]

    def close(self) -> None:
        try:
            self._monitor.connection.disconnect()
        finally:
            self._redis.close()
