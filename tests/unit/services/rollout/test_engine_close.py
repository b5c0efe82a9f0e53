"""services.rollout.server.close_engine: the engine closes after the call that holds its lock
ends, and no call reaches it afterwards (the worker thread racing the shutdown)."""

import threading
import time

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
    engine, lock, errors = Engine(), threading.Lock(), []
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
    engine, lock = Engine(), threading.Lock()
    lock.acquire()  # a call that never ends
    start = time.monotonic()
    close_engine(engine, lock, wait_s=0.2)
    assert engine.events == ["closed"] and 0.15 < time.monotonic() - start < 2.0
