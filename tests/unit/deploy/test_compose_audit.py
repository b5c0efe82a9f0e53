"""The compose test's publish audit (tests/e2e/compose/audit.py) against this machine's Redis and
the real publish-once script: a publish is counted once with its client's address, a duplicate
call (no XADD) is not, a publish whose group the learner already consumed and deleted is still
seen, and ``settle`` waits for what Redis ran before it."""

from __future__ import annotations

import uuid

import pytest
import redis

from brorl import queue as q
from brorl.cluster import REDIS_URL
from brorl.v1 import common_pb2
from tests.e2e.compose.audit import PathAudit


@pytest.fixture
def run():
    r = q.connect(REDIS_URL)
    try:
        r.ping()
    except redis.ConnectionError:
        pytest.fail(f"these tests need the Redis at {REDIS_URL}")
    run_id = f"audit-{uuid.uuid4().hex[:8]}"
    yield r, run_id
    r.delete(*q.keys(run_id).values())


def _job(channels: q.RunChannels, job_id: str):
    """One job sent and claimed by worker w1: its delivery and queue."""
    queue = channels.prompt_queue(consumer="w1")
    queue.put(job_id.encode())
    [delivery] = queue.read(1, block_ms=None)
    return queue, delivery


def test_every_publish_is_seen_once_with_its_address_and_duplicates_are_not(run):
    r, run_id = run
    channels = q.RunChannels(r, run_id)
    keys = channels.keys
    audit = PathAudit(REDIS_URL, run_id)
    try:
        queue, delivery = _job(channels, "job-1")
        group = common_pb2.PathGroup(group_id="g1", worker="w1").SerializeToString()
        data = group + b' "\\\x00 \xff'  # what MONITOR escapes, spaces and quotes included
        args = (delivery.entry_id, "job-1", keys["paths"], keys["done"], data)
        assert queue.publish_once_and_ack(*args) is True
        assert queue.publish_once_and_ack(*args) is False  # in the done set: no XADD
        # the learner took the group and deleted it before anyone read the stream
        r.delete(keys["paths"])
        audit.settle()
        [publish] = audit.of("job-1")
        assert publish.address == "127.0.0.1"
        assert publish.ms > 0
        assert audit.attempts == 2
        assert audit.of("job-2") == []
    finally:
        audit.close()


def test_settle_reports_an_audit_whose_connection_went_away(run):
    _r, run_id = run
    audit = PathAudit(REDIS_URL, run_id)
    audit.close()
    with pytest.raises(AssertionError, match="stopped|behind"):
        audit.settle()
