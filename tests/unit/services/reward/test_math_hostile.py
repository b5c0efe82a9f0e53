"""What a hostile completion costs: a comparison stops at its limit (the worker is killed and
replaced, the path gets status timeout), the next batch is answered normally, identical hostile
completions cost one limit, and answers too long to be answers are refused without parsing."""

from __future__ import annotations

import os
import threading
import time

import pytest

from brorl.contract import RewardStatus
from services.reward.base import ScoreItem
from services.reward.config import MathAnswerSpec
from services.reward.functions.math_verifier import MathAnswer
from services.reward.functions.math_workers import WorkerPool

# a fresh worker's first normal comparisons took over 1 s beside the suite's clusters
LIMIT_S = 3.0
NORMAL = ScoreItem("n", "", "so \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}")
HOSTILE = {
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "tall exponent": "\\boxed{10^{10^{10}}}",
    "factorial": "\\boxed{1000000!}",
    "deep fractions": "\\boxed{" + "\\frac{1}{" * 60 + "2" + "}" * 60 + "}",
    "deep parentheses": "\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
}


@pytest.fixture(scope="module")
def fn():
    f = MathAnswer("math_answer", MathAnswerSpec(timeout_s=LIMIT_S, processes=2))
    f._workers().start()
    yield f
    f.close()


@pytest.fixture(scope="module")
def slack(fn) -> float:
    """What answering costs on this machine now, beyond the limit: killing a worker, IPC, the
    service's own work. Measured from normal comparisons (the slowest of three, times three, plus
    a second), so a loaded machine does not fail the test and an unbounded one still does."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        [s] = fn.score_batch([NORMAL])
        times.append(time.perf_counter() - start)
        assert s.reward == 1.0
    return 1.0 + 3 * max(times)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_completion_costs_at_most_its_limit(fn, slack, name):
    fn._workers().start()  # the worker replaced by the previous case has finished its imports
    start = time.perf_counter()
    [s] = fn.score_batch([ScoreItem("h", "", HOSTILE[name], "1")])
    elapsed = time.perf_counter() - start
    assert s.reward == 0.0 and s.status in (RewardStatus.TIMEOUT, RewardStatus.OK)
    assert elapsed <= LIMIT_S + slack
    # The next batch is answered normally at once (by the other worker, while the killed one's
    # successor warms up beside it), and as fast as before once the successor is ready.
    [ok] = fn.score_batch([NORMAL])
    assert ok.reward == 1.0 and ok.status == RewardStatus.OK
    fn._workers().start()
    start = time.perf_counter()
    [ok] = fn.score_batch([NORMAL])
    assert ok.reward == 1.0 and time.perf_counter() - start < slack


def test_the_power_tower_times_out_and_the_worker_is_replaced(fn):
    fn._workers().start()
    restarts = fn._workers().restarts
    [s] = fn.score_batch([ScoreItem("h", "", HOSTILE["power tower"], "1")])
    assert s.status == RewardStatus.TIMEOUT and f"exceeded {LIMIT_S:g} s" in s.detail
    assert fn._workers().restarts == restarts + 1


def test_identical_hostile_completions_cost_one_limit(fn, slack):
    fn._workers().start()
    items = [ScoreItem(str(i), "", HOSTILE["power tower"], "1") for i in range(32)]
    start = time.perf_counter()
    scores = fn.score_batch(items)
    assert time.perf_counter() - start < LIMIT_S + slack  # not 32 limits
    assert {s.status for s in scores} == {RewardStatus.TIMEOUT}


def test_answers_too_long_to_be_answers_are_not_parsed(fn, slack):
    huge_sum = "\\boxed{" + "+".join(["1"] * 10_000) + "}"
    start = time.perf_counter()
    [s] = fn.score_batch([ScoreItem("h", "", huge_sum, "10000")])
    assert time.perf_counter() - start < slack  # no worker: a parse would take seconds
    assert s.reward == 0.0 and s.status == RewardStatus.OK


# ------------------------------------------------------------------ the pool itself


def misbehave(job):
    """A worker target for the pool tests: echoes, exits, or hangs."""
    if job == "exit":
        os._exit(3)
    if job == "hang":
        time.sleep(60)
    if job == "raise":
        raise ValueError("bad item")
    return job


TARGET = f"{__name__}:misbehave"


def test_pool_replaces_dead_and_hung_workers_and_keeps_order():
    pool = WorkerPool(TARGET, processes=2, timeout_s=0.5)
    try:
        out = pool.run(["a", "exit", "b", "hang", "raise", "c"])
        assert [o.ok for o in out] == [True, False, True, False, False, True]
        assert [o.value for o in out if o.ok] == ["a", "b", "c"]
        assert out[1].detail.startswith("math worker died") and out[3].timed_out
        assert out[4].detail == "ValueError: bad item" and not out[4].timed_out
        assert pool.restarts == 2
        assert [o.value for o in pool.run(["d", "e"])] == ["d", "e"]
    finally:
        pool.close()
    assert pool.run(["f"])[0].detail == "math workers are closed"


def test_pool_is_shared_by_concurrent_callers():
    pool = WorkerPool(TARGET, processes=2, timeout_s=5)
    results = {}
    try:

        def call(k):
            results[k] = [o.value for o in pool.run([f"{k}-{i}" for i in range(20)])]

        threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        pool.close()
    assert results == {k: [f"{k}-{i}" for i in range(20)] for k in range(4)}


def test_a_replaced_worker_is_replaced_once_and_the_pool_keeps_its_size():
    pool = WorkerPool(TARGET, processes=2, timeout_s=0.3)
    try:
        pool.run(["hang", "hang", "a", "b", "exit"])
        for _ in range(3):
            assert [o.value for o in pool.run(["c", "d", "e"])] == ["c", "d", "e"]
        pool.start()
        assert len(pool._all) == 2 and pool.restarts == 3
    finally:
        pool.close()
