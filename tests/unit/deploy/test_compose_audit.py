"""The compose test's publish audit (tests/e2e/compose/audit.py) against this machine's Redis and
the real publish-once script: a publish is counted once with its client's address, a duplicate
call (no XADD) is not, a publish whose group the learner already consumed and deleted is still
seen, and ``settle`` waits for what Redis ran before it (a mutation that returns at once fails
the flood test)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
import redis

from brorl import queue as q
from brorl.cluster import REDIS_URL
from brorl.v1 import common_pb2
from tests.e2e.compose.audit import PathAudit
from tests.e2e.compose.cluster import NAMESPACE


@pytest.fixture
def run():
    r = q.connect(REDIS_URL)
    try:
        r.ping()
    except redis.ConnectionError:
        pytest.fail(f"these tests need the Redis at {REDIS_URL}")
    run_id = f"audit-{uuid.uuid4().hex[:8]}"
    yield r, run_id
    r.delete(*q.keys(run_id, namespace=NAMESPACE).values())


@pytest.fixture
def job(run):
    """An audit started on the run, then job-1 sent and claimed by worker w1."""
    r, run_id = run
    channels = q.RunChannels(r, run_id, namespace=NAMESPACE)
    audit = PathAudit(REDIS_URL, run_id)
    queue = channels.prompt_queue(consumer="w1")
    queue.put(b"job-1")
    [delivery] = queue.read(1, block_ms=None)
    yield SimpleNamespace(r=r, keys=channels.keys, audit=audit, queue=queue, delivery=delivery)
    audit.close()


def test_every_publish_is_seen_once_with_its_address_and_duplicates_are_not(job):
    group = common_pb2.PathGroup(group_id="g1", worker="w1").SerializeToString()
    data = group + b' "\\\x00 \xff'  # what MONITOR escapes, spaces and quotes included
    args = (job.delivery.entry_id, "job-1", job.keys["paths"], job.keys["done"], data)
    assert job.queue.publish_once_and_ack(*args) is True
    assert job.queue.publish_once_and_ack(*args) is False  # in the done set: no XADD
    # the learner took the group and deleted it before anyone read the stream
    job.r.delete(job.keys["paths"])
    job.audit.settle()
    [publish] = job.audit.of("job-1")
    assert publish.address == "127.0.0.1"
    assert publish.ms > 0
    assert job.audit.attempts == 2
    assert job.audit.of("job-2") == []


def test_settle_waits_for_every_command_sent_before_it(job):
    args = (job.delivery.entry_id, "job-1", job.keys["paths"], job.keys["done"], b"g")
    assert job.queue.publish_once_and_ack(*args) is True
    # one round trip that makes Redis log 100,000 lines to MONITOR, far more than the reader
    # parses before the next call: a duplicate publish, seen only once the reader is through
    job.r.eval("for i = 1, 100000 do redis.call('EXISTS', KEYS[1]) end", 1, job.keys["paths"])
    assert job.queue.publish_once_and_ack(*args) is False
    job.audit.settle()
    assert job.audit.attempts == 2
    assert len(job.audit.of("job-1")) == 1


def test_settle_reports_an_audit_whose_connection_went_away(run):
    _r, run_id = run
    audit = PathAudit(REDIS_URL, run_id)
    audit.close()
    with pytest.raises(AssertionError, match="stopped|behind"):
        audit.settle()
