"""What every benchmark shares: stdout carries its one JSON object and nothing else
(tests/unit/bench/test_bench_smoke.py runs each at its smallest size and checks it)."""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def stdout_to_stderr():
    """Send this process's fd 1 (and its children's: vLLM logs to stdout) to stderr while the
    benchmark runs, so that stdout carries only the JSON printed after it."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
