"""Polled waits for tests: wait for the condition, not for a guessed number of seconds."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = "condition"
) -> T:
    """Call ``probe`` until it returns something truthy and return that; AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:.1f}s (last: {value!r})")
        time.sleep(interval)
