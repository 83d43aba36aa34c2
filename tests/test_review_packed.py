"""Review of packed topics (issue 14): reproductions of defects found by reading the
code. Each test asserts the documented behaviour and is marked xfail(strict=True)
while the defect stands, so the suite stays green and the marker must go with the fix."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from pawn_queue_sync import drain, layout
from pawn_queue_sync.queue import held
from tests.forking import in_child
from tests.short_leases import POLLING
from tests.test_consumer_regressions import JumpClock
from tests.test_packed_consume import (
    STALE,
    TOPIC,
    faulty_queue,
    leftovers,
    publish_segments,
)


def steady_reservations(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer reserves deliveries ahead, doubling while its polls follow within a
    second: made to hold however loaded the machine is (a gap of a second between two
    polls would reset it), so these tests do not depend on timing."""
    monkeypatch.setattr(held, "_RESERVE_GROWS_WITHIN_S", 3600.0)


def test_a_segment_whose_last_message_is_dead_lettered_by_retries_is_deleted() -> None:
    """retry() up to max_delivery_count: the next hand-out dead-letters the message and
    records it settled; with every message settled the segment must be finished
    (deleted, then its lease), as an ack or a nack of the last message does."""
    pq, _ = faulty_queue(max_delivery_count=2)
    (ids,) = publish_segments(pq, ["poison"], 1)
    c = pq.register_consumer("c", [TOPIC])
    for _ in range(2):
        (m,) = c.poll()
        c.retry(m, "boom")
    assert c.poll() == []  # dead-lettered instead of handed out
    pq.store.get(layout.dead_letter_key(TOPIC, ids[0]))
    for _ in range(3):
        assert c.poll() == []
    assert leftovers(pq) == []


def test_a_takeover_that_dead_letters_the_last_message_finishes_the_segment() -> None:
    """The holder dies with the only message out; the next taker finds it at
    max_delivery_count, dead-letters it and records it settled: nothing is left to
    deliver, so the segment must be finished (deleted, then its lease). It stays,
    held by the taker forever (its own held segments are never candidates)."""
    clock = JumpClock()
    pq, _ = faulty_queue(clock, **{**POLLING, "max_delivery_count": 1})
    (ids,) = publish_segments(pq, ["kills its process"], 1)
    assert [m.payload for m in pq.register_consumer("a", [TOPIC]).poll()] == [
        "kills its process"]
    clock.jump(STALE)  # a died holding it
    b = pq.register_consumer("b", [TOPIC])
    assert b.poll() == []  # dead-lettered instead of handed out
    pq.store.get(layout.dead_letter_key(TOPIC, ids[0]))
    for _ in range(2):
        clock.jump(STALE)
        assert b.poll() == []
    assert leftovers(pq) == []


def _lease_body(pq: Any, errors: Any) -> bytes:
    (seg_key,) = [o.key for o in pq.store.list(layout.segments_prefix(TOPIC)).objects]
    sid, _ = layout.parse_segment_key(TOPIC, seg_key)
    return json.dumps({
        "consumer_id": "x", "message_id": sid, "claimed_at": "2020-01-01T00:00:00+00:00",
        "expires_at": "2020-01-01T00:00:30+00:00", "nonce": "n", "segment_key": seg_key,
        "released": False,
        "progress": {"count": 2, "settled": [], "deliveries": [], "errors": errors},
    }).encode()


@pytest.mark.parametrize("bad", ["digit", "deep"])
def test_a_stale_unreadable_segment_lease_never_breaks_a_poll(bad: str) -> None:
    """docs/guarantees.md: a stale lease whose body cannot be read is taken over
    afresh (its messages delivered again, never lost), and a corrupt object never
    breaks a poll. An errors key that str.isdigit() accepts but int() refuses ('²')
    raises ValueError, a body nested deeper than the parser's limit RecursionError:
    neither is SegmentError, so every poll of the topic raises."""
    clock = JumpClock()
    pq, _ = faulty_queue(clock, **POLLING)
    _segment_with_unreadable_lease(pq, bad)
    clock.jump(STALE)
    c = pq.register_consumer("c", [TOPIC])
    got = c.poll(10)
    assert sorted(m.payload for m in got) == ["a", "b"]
    c.ack_many(got)
    assert leftovers(pq) == []


@pytest.mark.parametrize("bad", ["digit", "deep"])
def test_topic_stats_survives_an_unreadable_segment_lease(bad: str) -> None:
    """topic_stats counts an unreadable segment lease as settling nothing (stats.py);
    these two raise ValueError / RecursionError instead."""
    pq, _ = faulty_queue()
    _segment_with_unreadable_lease(pq, bad)
    assert pq.topic_stats(TOPIC)["pending"] == 2


def test_a_forked_child_does_not_hand_out_its_parents_reserved_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer reserves deliveries ahead in its segment's lease and hands them out
    later without a request. In a forked child the held segments (and their
    reservations) are copies of the parent's: a child's poll hands out the same
    reserved message as the parent's next poll, under one live lease (nothing is
    written: the store's copy in the child does not matter)."""
    steady_reservations(monkeypatch)
    pq, _ = faulty_queue()
    publish_segments(pq, list(range(10)), 10)
    c = pq.register_consumer("c", [TOPIC])
    first = c.poll(1) + c.poll(1)  # the second reservation counts 2 ahead
    assert [m.payload for m in first] == [0, 1]
    assert len(first[1].segment.reserved) == 1
    read, write = os.pipe()

    def child() -> int:
        got = c.poll(1)
        os.write(write, json.dumps([m.id for m in got]).encode())
        return 0

    assert in_child(child) == 0
    os.close(write)
    child_ids = json.loads(os.read(read, 65536) or b"[]")
    os.close(read)
    parent_ids = [m.id for m in c.poll(1)]
    assert parent_ids and not set(child_ids) & set(parent_ids), "handed out twice"


def test_drain_gives_its_segments_back_as_listen_does() -> None:
    """drain() (what process_topic runs in each Spark task) stops at max_messages with
    deliveries reserved ahead in its segment's lease. listen() and close() give such
    segments back (released, the reservations taken back); drain() does not, so the
    rest of the segment waits a visibility timeout and comes back with a delivery
    counted that no handler saw (repeated, it reaches max_delivery_count and
    dead-letters messages never handled)."""
    pq, _ = faulty_queue()
    publish_segments(pq, list(range(20)), 20)
    a = pq.register_consumer("a", [TOPIC])
    result = drain(a, lambda m: None, max_messages=5, threads=4, idle_timeout_seconds=0)
    assert result.processed == 5
    b = pq.register_consumer("b", [TOPIC])
    rest = b.poll(20)
    assert [m.payload for m in rest] == list(range(5, 20))
    assert [m.delivery_count for m in rest] == [1] * 15


def test_repeated_drains_never_dead_letter_messages_every_handler_acked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job draining at most 5 messages per run (process_topic(max_messages=...) on a
    schedule), each run a new consumer: every message is handled and acked, so none
    may ever be dead-lettered. The reservations each run leaves counted (drain does
    not give its segments back) reach max_delivery_count (2) on messages no handler
    saw, and the next run dead-letters them."""
    steady_reservations(monkeypatch)
    clock = JumpClock()
    pq, _ = faulty_queue(clock, **{**POLLING, "max_delivery_count": 2})
    publish_segments(pq, list(range(40)), 40)
    handled: list[int] = []
    for run in range(12):
        c = pq.register_consumer(f"run{run}", [TOPIC])
        drain(c, lambda m: handled.append(m.payload), max_messages=5, threads=4,
              idle_timeout_seconds=0)
        clock.jump(STALE)
    dead = [o.key for o in pq.store.list(layout.dead_letter_prefix(TOPIC)).objects]
    assert dead == []
    assert sorted(handled) == list(range(40))


@pytest.mark.parametrize("bad", ["digit", "deep"])
def test_the_spark_reader_survives_an_unreadable_segment_lease(bad: str) -> None:
    """segment_rows reads the lease to leave settled messages out; a lease it cannot
    read counts as none (all rows given). These bodies raise instead."""
    from pawn_queue_sync.spark.segments import segment_rows

    pq, _ = faulty_queue()
    seg_key = _segment_with_unreadable_lease(pq, bad)
    rows = list(segment_rows(pq.store, TOPIC, seg_key, pq.store.get(seg_key).body))
    assert [r[4] for r in rows] == ['"a"', '"b"']


_DECODE_FRAGMENTED = """
from datetime import datetime, timezone
from pawn_queue_sync.protocol.segments import Progress, SegmentLease
n = 16_000  # messages in the segment (max_segment_messages allows 100,000)
settled = tuple((i, i + 1) for i in range(0, n, 2))  # every other one acked
deliveries = []  # one each, some retried (two): runs of alternating values
for i in range(n):
    v = 2 if i % 4 == 1 else 1
    if deliveries and deliveries[-1][2] == v:
        deliveries[-1] = (deliveries[-1][0], i + 1, v)
    else:
        deliveries.append((i, i + 1, v))
p = Progress(count=n, settled=settled, deliveries=tuple(deliveries))
lease = SegmentLease.new("c", "s", "k", datetime.now(timezone.utc), 30.0, p)
assert SegmentLease.decode(lease.encode()).progress == p
"""


def test_a_fragmented_segment_lease_is_read_in_reasonable_time() -> None:
    """A lease whose progress has 8,000 settled runs (every other message of a 16,000
    message segment acked) must decode in seconds, not minutes: run in a child
    process killed at 15 s, so a slow decode cannot outlive the test."""
    import subprocess
    import sys

    try:
        subprocess.run([sys.executable, "-c", _DECODE_FRAGMENTED], check=True, timeout=15,
                       capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("decoding the lease took over 15 s")


_TAKE_OVER_HUGE_COUNT = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))  # 2 GiB: never the machine's
import uuid
from pawn_queue_sync import layout
from pawn_queue_sync.protocol.segments import Progress, SegmentLease
from tests.short_leases import POLLING
from tests.test_consumer_regressions import JumpClock
from tests.test_packed_consume import STALE, TOPIC, faulty_queue, publish_segments
clock = JumpClock()
pq, _ = faulty_queue(clock, **POLLING)
publish_segments(pq, ["fine"], 1)
sid = str(uuid.uuid4())
key = layout.segment_key(TOPIC, "20000101T000000_000000", sid, 999_999_999)
pq.store.put(key, b"not a segment\\n")
# a consumer claimed it (its first hand-out recorded) and died before reading it
progress, _, _ = Progress(count=999_999_999).hand_out(range(10), 3)
lease = SegmentLease.new("dead", sid, key, clock.now(), 3.0, progress)
pq.store.put(layout.segment_lease_key(TOPIC, sid), lease.encode())
clock.jump(STALE)
c = pq.register_consumer("c", [TOPIC])
got = []
for _ in range(3):  # the corrupt one (the oldest) may take a poll of its own
    got += c.poll(10)
assert [m.payload for m in got] == ["fine"], got
"""


def test_taking_over_a_lease_of_a_segment_key_with_a_huge_count_never_breaks_a_poll(
) -> None:
    """A corrupt object named as a segment of 999,999,999 messages, claimed by a
    consumer that died before reading it (the crash window between the claim and the
    GET): the next poll takes the stale lease over, then reads the object and
    quarantines it, and goes on. Run in a child process under a 2 GiB address-space
    limit, so a poll that tries to allocate gigabytes fails there (MemoryError)
    instead of exhausting the machine."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TAKE_OVER_HUGE_COUNT], timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def _segment_with_unreadable_lease(pq: Any, bad: str) -> str:
    """Publish one 2-message segment and give it a lease body that cannot be read
    (``digit``: an errors key '²'; ``deep``: nesting past the parser's limit); the
    segment's key."""
    publish_segments(pq, ["a", "b"], 2)
    (seg_key,) = [o.key for o in pq.store.list(layout.segments_prefix(TOPIC)).objects]
    sid, _ = layout.parse_segment_key(TOPIC, seg_key)
    body = (_lease_body(pq, {"\u00b2": "boom"}) if bad == "digit"
            else b"[" * 100_000 + b"]" * 100_000)
    pq.store.put(layout.segment_lease_key(TOPIC, sid), body)
    return seg_key
