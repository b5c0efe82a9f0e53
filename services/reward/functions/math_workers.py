"""Worker processes that compare math answers under a per-item time limit.

sympy can run for ever on a hostile answer (``9^9^9^9``, a 10,000-term sum) and math-verify's own
timeouts use ``signal.alarm``, which works only in a main thread, never in a gRPC handler thread.
So each comparison runs in one of a few worker processes; the caller waits at most ``timeout_s``
for its answer. A worker that does not answer in time is killed and replaced, and its item is
reported as timed out; the other workers and the service carry on. A worker that dies (its memory
limit, a crash in the parser) is replaced the same way.

A worker is ``python -m services.reward.functions.math_workers MODULE:FUNCTION MEMORY_MB``: a fresh
interpreter (never a fork of a process with gRPC threads, and nothing of the caller's ``__main__``
is imported), one JSON line per item on stdin, one JSON line per answer on its own pipe. Workers
start lazily (the first item that needs one) or on ``start()``; each says "ready" once its imports
are done, and the per-item clock starts only when a ready worker is handed the item.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 60.0  # a worker that cannot import its libraries in this time is broken
_ROOT = Path(__file__).resolve().parents[3]  # the directory that holds the `services` package


@dataclass
class Outcome:
    ok: bool
    value: Any = None  # the function's result when ok
    timed_out: bool = False
    detail: str = ""  # why not ok


class _Worker:
    def __init__(self, target: str, memory_mb: int):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, target, str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,  # unbuffered: select() sees every byte the worker wrote
            env=env,
            close_fds=True,
        )
        self.ready = False
        self._ready_lock = threading.Lock()  # start() and a caller may both wait for "ready"

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        with self._ready_lock:
            if not self.ready:
                line = self.read_line(timeout)
                self.ready = line is not None and json.loads(line) == ["ready"]
            return self.ready

    def send(self, item) -> None:
        self.proc.stdin.write((json.dumps(item) + "\n").encode())
        self.proc.stdin.flush()

    def read_line(self, timeout: float) -> bytes | None:
        """One line of the worker's answer pipe, or None when none came in ``timeout`` seconds."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError("worker exited")
        return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class WorkerPool:
    """``processes`` workers running ``target`` ("module:function", taking and returning JSON
    data) on one item at a time, each item limited to ``timeout_s`` of wall time. Thread-safe:
    concurrent ``run`` calls share the workers."""

    def __init__(self, target: str, processes: int, timeout_s: float, memory_mb: int = 0):
        self.target, self.processes = target, processes
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._closed = False
        self._starting = 0  # replacements being started in the background
        self.restarts = 0  # workers replaced after a timeout or a death

    def start(self) -> None:
        """Start the missing workers and wait until every worker is ready."""
        with self._lock:
            self._spawn_missing()
            workers = list(self._all)
        for w in workers:
            try:
                w.wait_ready()
            except (EOFError, OSError, ValueError):
                pass  # it died; the next item that gets it replaces it

    def _spawn_missing(self) -> None:
        for _ in range(max(0, self.processes - len(self._all) - self._starting)):
            self._spawn()

    def _spawn(self) -> _Worker:
        w = _Worker(self.target, self.memory_mb)
        self._all.add(w)
        self._idle.put(w)
        return w

    def run(self, items: list) -> list[Outcome]:
        """``target(item)`` for every item, in parallel over the workers; same order as
        ``items``."""
        if not items:
            return []
        if self._closed:
            return [Outcome(False, detail="math workers are closed") for _ in items]
        with self._lock:
            self._spawn_missing()  # not waited for: a ready worker is taken first
        results: list[Outcome | None] = [None] * len(items)
        todo = iter(range(len(items)))
        take = threading.Lock()

        def drive() -> None:
            while True:
                with take:
                    i = next(todo, None)
                if i is None:
                    return
                results[i] = self._one(items[i])

        threads = [threading.Thread(target=drive) for _ in range(min(self.processes, len(items)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results  # type: ignore[return-value]

    def _take(self) -> _Worker | None:
        """An idle worker, a ready one if any is (a replacement may still be importing)."""
        passed: list[_Worker] = []
        try:
            while True:
                try:
                    w = self._idle.get(timeout=1.0 if not passed else 0.0)
                except queue.Empty:
                    if passed:
                        return passed.pop(0)
                    if self._closed:
                        return None
                    continue
                if w not in self._all:
                    continue
                if w.ready or self._ready_now(w):
                    return w
                passed.append(w)
        finally:
            for w in passed:
                self._idle.put(w)

    @staticmethod
    def _ready_now(w: _Worker) -> bool:
        try:
            return w.wait_ready(timeout=0.0)
        except (EOFError, OSError, ValueError):
            return True  # dead: taking it now gets it replaced

    def _one(self, item) -> Outcome:
        w = self._take()
        if w is None:
            return Outcome(False, detail="math workers are closed")
        try:
            if not w.wait_ready():
                self._replace(w, "did not start")
                return Outcome(False, detail="math worker did not start")
            start = time.perf_counter()
            w.send(item)
            line = w.read_line(self.timeout_s)
        except (EOFError, OSError, ValueError):
            self._replace(w, "died")
            return Outcome(False, detail="math worker died while comparing (replaced)")
        if line is None:
            self._replace(w, f"timed out after {time.perf_counter() - start:.2f} s")
            return Outcome(
                False,
                timed_out=True,
                detail=f"comparison exceeded {self.timeout_s:g} s (worker replaced)",
            )
        self._idle.put(w)
        kind, value = json.loads(line)
        return Outcome(True, value) if kind == "ok" else Outcome(False, detail=value)

    def _replace(self, w: _Worker, why: str) -> None:
        """Kill ``w`` and start its successor; the caller's item is answered at once, while
        reaping the dead process and starting the new one (slow on a loaded machine) go on in
        the background."""
        log.warning("math worker pid %s %s; starting a new one", w.proc.pid, why)
        if w.proc.poll() is None:
            w.proc.kill()
        with self._lock:
            self._all.discard(w)
            self.restarts += 1
            self._starting += 1
        threading.Thread(target=self._succeed, args=(w,), daemon=True, name="math-worker").start()

    def _succeed(self, w: _Worker) -> None:
        w.kill()
        with self._lock:
            self._starting -= 1
            if not self._closed:
                self._spawn()  # gets ready while the others work

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all = list(self._all), set()
        for w in workers:
            w.kill()


def _serve(target: str, memory_mb: int) -> None:
    """The worker side: answers ``target(item)`` for each line of stdin."""
    import resource

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a library that prints must not break the protocol
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    module, name = target.split(":")
    fn = getattr(importlib.import_module(module), name)
    fn(None)  # load what the function needs before saying ready
    answers.write('["ready"]\n')
    answers.flush()
    for line in sys.stdin:
        try:
            answer = ["ok", fn(json.loads(line))]
        except MemoryError:
            answer = ["error", f"memory limit ({memory_mb} MiB) reached"]
        except Exception as exc:  # noqa: BLE001 - reported per item, the worker lives on
            answer = ["error", f"{type(exc).__name__}: {exc}"[:500]]
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
