"""services.rollout.server.close_engine: the engine closes after the call that holds its lock
ends, and no call reaches it afterwards (the worker thread racing the shutdown); the engine's
lock (services.rollout.engine.EngineLock) goes to its waiters in the order they asked."""

import threading
import time

import pytest

from services.rollout.engine import EngineLock
from services.rollout.server import close_engine


class Engine:
    def __init__(self):
        self.events: list[str] = []

    def call(self, seconds: float) -> None:
        if "closed" in self.events:
            raise AttributeError("'NoneType' object has no attribute 'reset_prefix_cache'")
        self.events.append("call")
        time.sleep(seconds)
        self.events.append("call done")

    def close(self) -> None:
        self.events.append("closed")


def worker(engine: Engine, lock: threading.Lock, errors: list) -> None:
    """The worst worker loop: it never looks at the stop event, and calls the engine whenever
    it gets the lock."""
    while True:
        try:
            if lock.acquire(timeout=0.05):
                try:
                    engine.call(0.2)
                finally:
                    lock.release()
        except AttributeError as exc:
            errors.append(exc)
            return


def test_close_waits_for_the_running_call_and_keeps_the_lock():
    engine, lock, errors = Engine(), EngineLock(), []
    thread = threading.Thread(target=worker, args=(engine, lock, errors), daemon=True)
    thread.start()
    while "call" not in engine.events:
        time.sleep(0.01)
    close_engine(engine, lock, wait_s=5.0)
    time.sleep(0.3)  # the worker would call again now if it could
    assert engine.events[-2:] == ["call done", "closed"]
    assert engine.events.count("closed") == 1 and not errors
    assert lock.locked()


def test_close_goes_ahead_when_the_call_outlives_the_wait():
    engine, lock = Engine(), EngineLock()
    lock.acquire()  # a call that never ends
    start = time.monotonic()
    close_engine(engine, lock, wait_s=0.2)
    assert engine.events == ["closed"] and 0.15 < time.monotonic() - start < 2.0


def test_the_lock_goes_to_its_waiters_in_the_order_they_asked():
    lock, order = EngineLock(), []
    lock.acquire()

    def waiter(name: str) -> None:
        with lock:
            order.append(name)

    threads = []
    for name in "abc":
        threads.append(threading.Thread(target=waiter, args=(name,)))
        threads[-1].start()
        while len(lock._waiters) < len(threads):  # queued before the next one asks
            time.sleep(0.001)
    lock.release()
    # the releasing thread asks again at once: it queues behind a, b and c
    with lock:
        order.append("main")
    for t in threads:
        t.join()
    assert order == ["a", "b", "c", "main"] and not lock.locked()


def test_a_wait_that_times_out_leaves_no_waiter_behind():
    lock = EngineLock()
    assert lock.acquire()
    assert not lock.acquire(timeout=0.05) and not lock.acquire(blocking=False)
    assert not lock._waiters
    lock.release()
    assert not lock.locked() and lock.acquire(timeout=0.05)
    lock.release()
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
