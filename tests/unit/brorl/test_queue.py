"""brorl.queue against the real Redis on 127.0.0.1:6379 (keys are unique per test)."""

import threading
import time
import uuid

import pydantic
import pytest
import redis

from brorl.queue import NamespaceLease, RunChannels, StreamQueue, connect, keys, lease_key
from brorl.v1 import common_pb2
from services.learner.config import LearnerServiceConfig
from services.rollout.config import RolloutServiceConfig
from tests.waiting import wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def r():
    client = connect("redis://127.0.0.1:6379/0")
    prefix = f"test:{uuid.uuid4().hex}"
    yield client, prefix
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


def make(client, prefix, consumer, **kw):
    return StreamQueue(
        client, f"{prefix}:s", "g", consumer=consumer, dead_stream=f"{prefix}:dead", **kw
    )


def test_entries_are_delivered_once_and_stay_pending_until_acked(r):
    client, prefix = r
    a, b = make(client, prefix, "a"), make(client, prefix, "b")
    a.put(b"one")
    [d] = a.read(1, block_ms=100)
    assert d.data == b"one" and d.deliveries == 1
    assert b.read(1, block_ms=50) == []  # not handed out twice while a holds it
    assert a.pending_count() == 1
    a.ack(d.entry_id)
    assert a.pending_count() == 0


def test_dead_consumers_entries_are_reclaimed_then_dead_lettered(r):
    client, prefix = r
    a = make(client, prefix, "a", claim_idle_ms=20, max_deliveries=2)
    b = make(client, prefix, "b", claim_idle_ms=20, max_deliveries=2)
    a.put(b"job")
    [first] = a.read(1, block_ms=100)  # a "dies" holding it
    [again] = wait_until(lambda: b.read(1, block_ms=10), what="b reclaims a's entry")
    assert again.entry_id == first.entry_id and again.deliveries == 2
    # b dies too: the third delivery would exceed the maximum, so the entry is dead-lettered
    wait_until(
        lambda: a.read(1, block_ms=10) == [] and client.xlen(f"{prefix}:dead") == 1,
        what="the entry dead-lettered",
    )
    dead = client.xrange(f"{prefix}:dead")
    assert len(dead) == 1 and dead[0][1][b"data"] == b"job"
    assert a.pending_count() == 0


def test_publish_once_and_ack_is_idempotent_by_job_id(r):
    client, prefix = r
    a = make(client, prefix, "a", claim_idle_ms=10)
    b = make(client, prefix, "b", claim_idle_ms=10)
    a.put(b"job")
    [d1] = a.read(1, block_ms=100)
    [d2] = wait_until(lambda: b.read(1, block_ms=10))  # both believe they own the job
    assert b.publish_once_and_ack(
        d2.entry_id, "job-1", f"{prefix}:out", f"{prefix}:done", b"result"
    )
    assert not a.publish_once_and_ack(
        d1.entry_id, "job-1", f"{prefix}:out", f"{prefix}:done", b"result"
    )
    assert client.xlen(f"{prefix}:out") == 1
    assert a.pending_count() == 0


def test_stream_length_is_bounded(r):
    client, prefix = r
    q = make(client, prefix, "a", maxlen=100)
    for i in range(1000):
        q.put(b"x")
    assert client.xlen(f"{prefix}:s") < 300  # approximate trimming


def test_one_lease_holds_several_entries_until_each_is_released(r, caplog):
    """A worker that claims jobs together leases them together: each stays its own until
    released and acked; releasing one first stops its renewal without a false alarm."""
    client, prefix = r
    a = make(client, prefix, "a", claim_idle_ms=300)
    b = make(client, prefix, "b", claim_idle_ms=300)
    a.put(b"first")
    a.put(b"second")
    first, second = a.read(2, block_ms=100)
    with caplog.at_level("WARNING", logger="brorl.streams"):
        with a.lease(first.entry_id, second.entry_id) as held:
            assert held == {first.entry_id, second.entry_id}
            held.discard(first.entry_id)
            a.ack(first.entry_id)
            time.sleep(1.2)  # four claim idle times
            assert b.read(2, block_ms=50) == []  # the second is still renewed
        assert "lost the lease" not in caplog.text
    [again] = wait_until(lambda: b.read(2, block_ms=10), what="b reclaims the second")
    assert again.entry_id == second.entry_id


def test_a_renewed_lease_keeps_a_long_job_from_being_reclaimed(r):
    client, prefix = r
    a = make(client, prefix, "a", claim_idle_ms=300)
    b = make(client, prefix, "b", claim_idle_ms=300)
    a.put(b"long job")
    [d] = a.read(1, block_ms=100)
    with a.lease(d.entry_id):
        time.sleep(1.2)  # a deliberate span: four times the claim idle time
        assert b.read(1, block_ms=50) == []  # a is alive and renewing: not reclaimed
    # a stops renewing (dies): b takes the job once it has been idle for claim_idle_ms
    [again] = wait_until(lambda: b.read(1, block_ms=10), what="b reclaims the job")
    assert again.entry_id == d.entry_id and again.deliveries == 2  # renewals are not deliveries
    assert not a.renew(d.entry_id)  # a presumed-dead consumer cannot take it back
    assert (
        client.xpending_range(f"{prefix}:s", "g", min="-", max="+", count=5)[0]["consumer"] == b"b"
    )


def test_an_entry_acked_elsewhere_leaves_the_lease_without_an_alarm(r, caplog):
    """A job published by another process (the worker's tail process) under the worker's name
    is acked while the worker's lease still holds it: the lease lets it go quietly; an entry
    another consumer took over is still reported."""
    client, prefix = r
    a = make(client, prefix, "a", claim_idle_ms=300)
    b = make(client, prefix, "b", claim_idle_ms=300)
    a.put(b"published elsewhere")
    a.put(b"taken over")
    first, second = a.read(2, block_ms=100)
    with a.lease(first.entry_id, second.entry_id, every_s=0.05) as held:
        make(client, prefix, "a").ack(first.entry_id)
        client.xclaim(f"{prefix}:s", "g", "b", 0, [second.entry_id])
        wait_until(lambda: not held, what="both entries leave the lease")
    assert caplog.text.count("lost the lease") == 1 and second.entry_id in caplog.text
    assert b.pending_count() == 1


def test_entries_put_together_wake_a_blocked_reader_together(r):
    """put_many is one transaction: a consumer blocked on the stream gets all of its entries
    in one read (entries put one by one wake it at the first: a worker's first engine call would
    hold one job)."""
    client, prefix = r
    name = f"reader-{uuid.uuid4().hex[:8]}"
    reader = make(redis.Redis.from_url("redis://127.0.0.1:6379/0", client_name=name), prefix, "a")
    got: list = []
    thread = threading.Thread(target=lambda: got.extend(reader.read(10, block_ms=10_000)))
    thread.start()
    wait_until(
        lambda: any(c["name"] == name and "b" in c["flags"] for c in client.client_list()),
        what="the reader blocks on the stream",
    )
    ids = make(client, prefix, "producer").put_many([b"one", b"two", b"three"])
    thread.join(timeout=10)
    assert [d.data for d in got] == [b"one", b"two", b"three"]
    assert [d.entry_id for d in got] == ids
    assert make(client, prefix, "p2").put_many([]) == []


def test_a_read_without_blocking_returns_at_once(r):
    client, prefix = r
    q = make(client, prefix, "a")
    assert q.read(5, block_ms=None) == []
    q.put(b"x")
    assert [d.data for d in q.read(5, block_ms=None)] == [b"x"]
    with pytest.raises(ValueError, match="BLOCK 0"):
        q.read(1, block_ms=0)  # Redis would wait forever


def test_a_published_weight_pointer_is_announced_to_the_runs_listeners_only(r):
    client, prefix = r
    space = prefix.replace(":", "-")
    run, other = (RunChannels(client, name, namespace=space) for name in ("run", "other"))
    listening, elsewhere = run.weight_announcements(), other.weight_announcements()
    try:
        assert listening.next(0.05) is None  # nothing announced yet
        pointer = common_pb2.WeightVersion(version=3, uri="/w/3", sha256="ab" * 32)
        run.publish_weights(pointer)
        assert listening.next(2.0) == pointer == run.read_weights()
        assert listening.next(0.05) is None and elsewhere.next(0.05) is None
    finally:
        listening.close()
        elsewhere.close()
        for key in run.keys.values():
            client.delete(key)


def test_clusters_sharing_a_redis_keep_apart_under_the_same_run_id(r):
    """Two namespaces each run "exp": a fresh start of one (its leftovers dropped) leaves the
    other's jobs, groups and weight pointer as they were."""
    client, prefix = r
    mine, theirs = (RunChannels(client, "exp", namespace=f"{prefix[5:]}-{c}") for c in "ab")
    try:
        assert not set(mine.keys.values()) & set(theirs.keys.values())
        for channels in (mine, theirs):
            channels.prompt_queue().put(b"job")
            channels.path_queue().put(b"group")
            channels.publish_weights(common_pb2.WeightVersion(version=2, uri=channels.namespace))
        mine.clear_prompts()
        mine.clear_paths()
        lengths = {
            ch.namespace: [s["length"] for s in ch.stream_stats().values()] for ch in (mine, theirs)
        }
        assert lengths == {mine.namespace: [0, 0], theirs.namespace: [1, 1]}
        assert theirs.read_weights().uri == theirs.namespace
    finally:
        client.delete(*mine.keys.values(), *theirs.keys.values())


@pytest.mark.parametrize(
    "namespace, run_id, refused",
    [
        ("a:b", "run", "namespace"),
        ("ns", "x:prompts", "run id"),
        ("", "run", "namespace"),
        ("ns", "r" * 65, "run id"),
        ("ns", "", "run id"),
    ],
)
def test_a_name_that_could_run_into_another_runs_keys_is_refused(namespace, run_id, refused):
    with pytest.raises(ValueError, match=f"^{refused} .*letters, digits"):
        keys(run_id, namespace=namespace)


@pytest.mark.parametrize(
    "build",
    [
        lambda: LearnerServiceConfig(namespace="a:b"),
        lambda: RolloutServiceConfig(model="m", namespace="a:b"),
        lambda: RolloutServiceConfig(model="m", run_id="x:y"),
    ],
    ids=["learner-namespace", "rollout-namespace", "rollout-run-id"],
)
def test_the_services_refuse_such_a_name_when_they_read_their_config(build):
    with pytest.raises(pydantic.ValidationError, match="should match pattern"):
        build()


def test_one_learner_at_a_time_holds_a_namespace_and_a_dead_ones_hold_lapses(r):
    client, prefix = r
    space = prefix.replace(":", "-")
    first, second = (NamespaceLease(client, space, name, lease_s=0.6) for name in "AB")
    try:
        assert first.take() == ""
        started = time.monotonic()
        assert second.take() == "A"  # A renews its lease while B waits one lease for it to lapse
        assert time.monotonic() - started >= 0.6
        assert first.take() == ""  # its own holder takes it again at once
        first.release()
        assert second.take() == ""  # released: at once
        second._stop.set()  # B dies: its lease is no longer renewed, nor released
        second._renewing.join()
        assert first.take() == ""  # B's lease lapsed while A waited for it (one lease + 1 s)
    finally:
        first.release()
        client.delete(lease_key(space))
