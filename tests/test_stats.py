"""``pq.stats(topic)`` and ``pq.stats_all()`` (issue 16): counts of plain and packed
topics on SeaweedFS and the local store, checked against the messages published, held,
acked and nacked (every message in exactly one count, or acked); the bound; the
requests each call reports against the requests a proxy saw; leases and consumers
judged by the server's clock (a memory store on a manual clock)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import (
    InvalidArgument,
    InvalidTopicName,
    Message,
    PawnQueue,
    TopicNotFoundError,
    layout,
)
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.config import load_config
from pawn_queue_sync.queue.consumer import Consumer
from pawn_queue_sync.queue.topic_stats import TopicStats
from pawn_queue_sync.storage.factory import build_store
from pawn_queue_sync.testing import memory_queue
from tests.fault_proxy import FaultProxy
from tests.servers import S3Server, config_dict, deep_merge
from tests.test_deadletters import Wrapped, config  # noqa: F401  (the fixture)

TOPIC = "orders"
DEADLINE = 60.0
#: Leases that outlive a slow run under load: a held message stays in flight.
LONG_LEASES = {"polling": {"visibility_timeout_seconds": 600}}


class Counted(FaultProxy):
    """A proxy that injects nothing and records each request's method."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.methods: list[str] = []

    def _seen(self, method: str, path: str) -> None:
        self.methods.append(method)


@pytest.fixture(params=["seaweedfs", "local"])
def counted(request: pytest.FixtureRequest, tmp_path: Path
            ) -> Iterator[tuple[PawnQueue, Any]]:
    """A started queue and what counts its requests: on SeaweedFS a proxy that sees
    every HTTP request (``.requests``, ``.methods``), on the local store a store that
    counts its calls (``.calls``)."""
    if request.param == "seaweedfs":
        real_s3: S3Server = request.getfixturevalue("real_s3")
        bucket: str = request.getfixturevalue("real_bucket")
        with Counted(real_s3.endpoint_url) as proxy:
            cfg = config_dict(real_s3, bucket)
            cfg["s3"]["endpoint_url"] = proxy.endpoint_url
            with PawnQueue.from_config(cfg) as pq:
                yield pq, proxy
        return
    cfg = load_config({"local": {"path": str(tmp_path / "store")}})
    store = Wrapped(build_store(cfg))
    with PawnQueue(cfg, store=store) as pq:  # type: ignore[arg-type]
        yield pq, store
    store.inner.close()


def sent(counter: Any) -> int:
    """Requests so far: the proxy's count, or the local store's calls."""
    if isinstance(counter, Wrapped):
        return sum(counter.calls.values())
    return int(counter.requests)


def held(consumer: Consumer, n: int) -> list[Message]:
    """Poll until ``n`` messages are in hand (a poll may bring fewer)."""
    got: list[Message] = []
    end = time.monotonic() + DEADLINE
    while len(got) < n:
        assert time.monotonic() < end, f"only {len(got)} of {n} messages came"
        got += consumer.poll(max_messages=n - len(got))
    return got


def drain(consumer: Consumer, n: int) -> set[str]:
    """Ack messages until ``n`` distinct ones were acked; their ids (none twice)."""
    acked: set[str] = set()
    end = time.monotonic() + DEADLINE
    while len(acked) < n:
        assert time.monotonic() < end, f"only {len(acked)} of {n} messages came"
        for msg in consumer.poll(max_messages=50):
            assert msg.id not in acked, f"{msg.id} delivered twice"
            msg.ack()
            acked.add(msg.id)
    return acked


def counts(s: TopicStats) -> tuple[int, int, int, int]:
    return s.pending, s.in_flight, s.dead_lettered, s.delayed


def put_delayed(pq: PawnQueue, topic: str, n: int) -> None:
    """``n`` objects under ``delayed/`` (what the delay helper's publish writes)."""
    for i in range(n):
        key = f"{layout.delayed_prefix(topic)}20991231T000000_{i:06d}-{uuid.uuid4()}-d1000.json"
        pq.store.put(key, b"{}")


def key_time(key: str) -> datetime:
    name = key.rsplit("/", 1)[-1]
    return datetime.strptime(name[:22], "%Y%m%dT%H%M%S_%f").replace(tzinfo=timezone.utc)


# -- plain and packed topics, counted --------------------------------------------------------


def test_plain_topic_every_message_in_one_count(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue.from_config(deep_merge(config, LONG_LEASES)) as pq:
        pq.create_topic(TOPIC)
        ids = pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(20)])
        s = pq.stats(TOPIC)
        assert counts(s) == (20, 0, 0, 0) and not s.packed and s.exact
        consumer = pq.register_consumer("c", [TOPIC])
        hand = held(consumer, 8)
        s = pq.stats(TOPIC)
        assert counts(s) == (12, 8, 0, 0)
        # the oldest pending message is the oldest key nobody holds
        leased = {m.id for m in hand}
        keys = [o.key for o in pq.store.list(layout.messages_prefix(TOPIC)).objects
                if layout.parse_message_key(TOPIC, o.key) not in leased]
        assert s.server_time is not None
        assert s.oldest_pending_age_seconds == max(
            0.0, (s.server_time - key_time(min(keys))).total_seconds())
        for m in hand[:3]:
            m.ack()
        for m in hand[3:5]:
            m.nack("bad order")
        put_delayed(pq, TOPIC, 4)
        assert counts(pq.stats(TOPIC)) == (12, 3, 2, 4)  # 3 acked: 12 + 3 + 2 + 3 = 20
        for m in hand[5:]:
            m.release()
        assert counts(pq.stats(TOPIC)) == (15, 0, 2, 4)
        rest = drain(consumer, 15)
        assert rest | {m.id for m in hand[:5]} == set(ids)  # none lost
        s = pq.stats(TOPIC)
        assert counts(s) == (0, 0, 2, 4) and s.oldest_pending_age_seconds is None


def test_packed_topic_segments_held_and_given_back(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue.from_config(deep_merge(config, LONG_LEASES)) as pq:
        pq.create_topic(TOPIC, packed=True)
        ids = pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(30)])
        (segment,) = pq.store.list(layout.segments_prefix(TOPIC)).objects
        assert layout.parse_segment_key(TOPIC, segment.key) is not None
        # a single message beside the segment (redriven, or from before the switch)
        single = str(uuid.uuid4())
        pq.store.put(layout.message_key(TOPIC, "20260101T000000_000000", single),
                     layout.canonical_json({"id": single, "topic": TOPIC, "payload": 1,
                                            "producer_id": None,
                                            "created_at": "2026-01-01T00:00:00+00:00"}))
        s = pq.stats(TOPIC)
        assert s.packed and counts(s) == (31, 0, 0, 0) and s.exact
        assert s.server_time is not None and s.oldest_pending_age_seconds == (
            s.server_time - datetime(2026, 1, 1, tzinfo=timezone.utc)).total_seconds()
        consumer = pq.register_consumer("c", [TOPIC])
        hand = held(consumer, 10)
        assert all(m.segment is not None for m in hand)  # segments first
        # every unsettled message of a held segment is in flight, handed out or not
        s = pq.stats(TOPIC)
        assert counts(s) == (1, 30, 0, 0)
        assert s.oldest_pending_age_seconds == (  # the single message: still the oldest
            s.server_time - datetime(2026, 1, 1, tzinfo=timezone.utc)).total_seconds()
        for m in hand[:6]:
            m.ack()
        hand[6].nack("bad order")
        assert counts(pq.stats(TOPIC)) == (1, 23, 1, 0)
        for m in hand[7:]:
            m.release()
        assert counts(pq.stats(TOPIC)) == (1, 23, 1, 0)  # still in its held segment
        consumer.close()  # gives the segment back: its messages wait again
        assert counts(pq.stats(TOPIC)) == (24, 0, 1, 0)
        rest = drain(pq.register_consumer("d", [TOPIC]), 24)
        assert rest | {m.id for m in hand[:7]} == set(ids) | {single}  # none lost
        assert counts(pq.stats(TOPIC)) == (0, 0, 1, 0)


# -- leases and consumers by the server's clock ------------------------------------------------


MANUAL = {"polling": {"visibility_timeout_seconds": 30},
          "registry": {"heartbeat_interval_seconds": 10}}


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_a_stale_lease_counts_as_pending_and_a_silent_consumer_as_dead(packed: bool) -> None:
    clock = FakeClock()
    with memory_queue(MANUAL, clock=clock) as pq:
        pq.create_topic(TOPIC, packed=packed)
        pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(10)])
        consumer = pq.register_consumer("c", [TOPIC])
        hand = consumer.poll(max_messages=4)
        assert len(hand) == 4
        s = pq.stats(TOPIC)
        assert counts(s) == ((0, 10, 0, 0) if packed else (6, 4, 0, 0))
        (status,) = s.consumers
        entry = pq.store.head(layout.registry_key("consumers", status.id))
        assert (status.name, status.alive, status.last_seen) == ("c", True, entry.last_modified)
        assert status.to_dict()["topics"] is None  # the registry does not record them
        # a lease lives visibility_timeout_seconds (+1 s grace) after its last write
        clock.advance(31.0)
        assert counts(pq.stats(TOPIC)) == ((0, 10, 0, 0) if packed else (6, 4, 0, 0))
        clock.advance(0.5)
        assert counts(pq.stats(TOPIC)) == (10, 0, 0, 0)
        # alive while its entry was written within 3 heartbeat intervals (30 s)
        assert not pq.stats(TOPIC).consumers[0].alive
    with memory_queue(MANUAL, clock=FakeClock()) as pq:
        pq.create_topic(TOPIC)
        pq.register_consumer("c", [TOPIC])
        pq.context.clock.advance(30.0)  # type: ignore[attr-defined]
        assert pq.stats(TOPIC).consumers[0].alive
        pq.context.clock.advance(0.001)  # type: ignore[attr-defined]
        assert not pq.stats(TOPIC).consumers[0].alive


def test_what_each_odd_object_counts_as() -> None:
    """A foreign object under messages/ waits (a consumer quarantines it); a live lease
    whose message is gone (its ack under way) holds nothing; a segment whose lease
    cannot be read is held while that lease is live, and settles nothing; a lease of
    a segment that is gone counts nothing; foreign keys under segments/ are not
    segments."""
    clock = FakeClock()
    with memory_queue(MANUAL, clock=clock) as pq:
        pq.create_topic(TOPIC, packed=True)
        pq.store.put(f"{layout.messages_prefix(TOPIC)}notes.txt", b"hello")
        pq.store.put(layout.lease_key(TOPIC, str(uuid.uuid4())), b"{}")
        sid = str(uuid.uuid4())
        pq.store.put(layout.segment_key(TOPIC, "20251231T030405_000000", sid, 7), b"x")
        pq.store.put(layout.segment_lease_key(TOPIC, sid), b"not a lease")
        pq.store.put(layout.segment_lease_key(TOPIC, str(uuid.uuid4())), b"{}")
        pq.store.put(f"{layout.segments_prefix(TOPIC)}notes.seg", b"x")
        s = pq.stats(TOPIC)
        assert counts(s) == (1, 7, 0, 0)
        assert s.oldest_pending_age_seconds is None  # the foreign key has no time
        clock.advance(32.0)
        s = pq.stats(TOPIC)
        assert counts(s) == (8, 0, 0, 0)
        assert s.server_time is not None and s.oldest_pending_age_seconds == (
            s.server_time - datetime(2025, 12, 31, 3, 4, 5, tzinfo=timezone.utc)).total_seconds()


# -- the bound and the cost ------------------------------------------------------------------


def test_listings_stop_at_max_keys_and_requests_are_what_was_sent(
    counted: tuple[PawnQueue, Any]
) -> None:
    pq, counter = counted
    pq.create_topic(TOPIC)
    pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(12)])
    for _ in range(7):
        mid = str(uuid.uuid4())
        pq.store.put(layout.dead_letter_key(TOPIC, mid), b"{}")
    put_delayed(pq, TOPIC, 3)
    before = sent(counter)
    s = pq.stats(TOPIC)
    assert sent(counter) - before == s.requests
    assert counts(s) == (12, 0, 7, 3) and s.exact
    before = sent(counter)
    s = pq.stats(TOPIC, max_keys=5)
    assert sent(counter) - before == s.requests
    assert counts(s) == (5, 0, 5, 3) and not s.exact
    assert counts(pq.stats(TOPIC, max_keys=None)) == (12, 0, 7, 3)
    # read-only: listings and GETs (HEADs at most), nothing written or deleted
    if isinstance(counter, Wrapped):
        counter.calls.clear()
        pq.stats_all()
        assert set(counter.calls) <= {"list", "get", "head"}, counter.calls
    else:
        counter.methods.clear()
        pq.stats_all()
        assert set(counter.methods) <= {"GET", "HEAD"}, counter.methods


def test_a_listing_longer_than_a_page(counted: tuple[PawnQueue, Any]) -> None:
    """1,100 dead letters: two LIST pages, each counted; a bound of 1,050 stops on the
    second page."""
    pq, counter = counted
    pq.create_topic(TOPIC)
    keys = [layout.dead_letter_key(TOPIC, str(uuid.uuid4())) for _ in range(1100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: pq.store.put(k, b"{}"), keys))
    for bound, dead, exact in [(None, 1100, True), (1050, 1050, False), (10_000, 1100, True)]:
        before = sent(counter)
        s = pq.stats(TOPIC, max_keys=bound)
        assert (s.dead_lettered, s.exact) == (dead, exact)
        assert sent(counter) - before == s.requests


def test_stats_all_counts_every_topic_and_nothing_else(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("a")
        pq.create_topic("b", packed=True)
        pq.create_topic("c")
        producer = pq.register_producer("p")
        producer.publish_batch("a", [1, 2, 3])
        producer.publish_batch("b", [1, 2])
        pq.store.put("junk/x.txt", b"not a topic")  # a prefix without a marker
        pq.register_consumer("w", ["a"])
        found = pq.stats_all()
        assert [s.topic for s in found] == ["a", "b", "c"]
        assert [(s.packed, *counts(s)) for s in found] == [
            (False, 3, 0, 0, 0), (True, 2, 0, 0, 0), (False, 0, 0, 0, 0)]
        assert all(s.consumers == found[0].consumers for s in found)
        assert [c.name for c in found[0].consumers] == ["w"]
        doc = json.loads(json.dumps([s.to_dict() for s in found]))
        assert doc[0]["consumers"][0]["name"] == "w" and doc[1]["packed"] is True
        assert datetime.fromisoformat(doc[0]["server_time"]) == found[0].server_time
        assert set(doc[0]) == {"topic", "packed", "pending", "in_flight", "dead_lettered",
                               "delayed", "oldest_pending_age_seconds", "exact",
                               "server_time", "requests", "consumers", "consumers_exact"}


def test_stats_all_requests_add_up(counted: tuple[PawnQueue, Any]) -> None:
    pq, counter = counted
    for name in ("a", "b"):
        pq.create_topic(name, packed=name == "b")
    pq.store.put("junk/x.txt", b"not a topic")
    pq.register_consumer("w", ["a"])
    before = sent(counter)
    found = pq.stats_all()
    assert sum(s.requests for s in found) == sent(counter) - before
    before = sent(counter)  # the consumer's name is known now: no GET of its entry
    found = pq.stats_all()
    assert sum(s.requests for s in found) == sent(counter) - before


# -- bad input ------------------------------------------------------------------------------


def test_bad_arguments_are_typed_errors_and_change_nothing(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue.from_config(config) as pq:
        pq.create_topic(TOPIC)
        before = {o.key: o.etag for o in pq.store.list("").objects}
        for bad in (0, -1, True, 1.5, "10"):
            with pytest.raises(InvalidArgument):
                pq.stats(TOPIC, max_keys=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument):
                pq.stats_all(max_keys=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidTopicName):
            pq.stats("../etc")
        with pytest.raises(TopicNotFoundError):
            pq.stats("ghost")
        pq.store.put("ghost/messages/x.json", b"{}")  # objects, but no marker
        with pytest.raises(TopicNotFoundError):
            pq.stats("ghost")
        pq.store.delete("ghost/messages/x.json")
        assert {o.key: o.etag for o in pq.store.list("").objects} == before
        assert counts(pq.stats(TOPIC)) == (0, 0, 0, 0)


# -- delayed messages ---------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_delayed_messages_count_once_until_promoted(config: dict[str, Any],  # noqa: F811
                                                    packed: bool) -> None:
    with PawnQueue.from_config(config) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        later = [producer.publish(TOPIC, {"n": i}, delay_seconds=2) for i in range(3)]
        now = producer.publish_batch(TOPIC, [{"n": 3}, {"n": 4}])
        s = pq.stats(TOPIC)
        assert counts(s) == (2, 0, 0, 3)  # delayed ones are not pending
        consumer = pq.register_consumer("c", [TOPIC])
        assert drain(consumer, 5) == set(later) | set(now)  # its polls promote them
        assert counts(pq.stats(TOPIC)) == (0, 0, 0, 0)


def test_no_message_segment_or_delayed_body_is_read() -> None:
    """Stats GETs only segment leases and registry entries (names), never a message, a
    segment or a delayed message."""
    read: list[str] = []
    clock = FakeClock()

    def record(op: str, key: str) -> None:
        if op == "get":
            read.append(key)

    with memory_queue(MANUAL, clock=clock, hooks=record) as pq:
        pq.create_topic(TOPIC, packed=True)
        producer = pq.register_producer("p")
        producer.publish_batch(TOPIC, [{"n": i} for i in range(5)])
        producer.publish(TOPIC, {"n": 5}, delay_seconds=60)
        pq.store.put(layout.message_key(TOPIC, "20260101T000000_000000", str(uuid.uuid4())),
                     b"{}")
        consumer = pq.register_consumer("c", [TOPIC])
        assert len(consumer.poll(max_messages=2)) == 2  # a segment under a lease
        read.clear()
        s = pq.stats(TOPIC)
        assert counts(s) == (1, 5, 0, 1)
        allowed = (layout.segment_leases_prefix(TOPIC), layout.REGISTRY_PREFIX)
        assert read and all(k.startswith(allowed) for k in read), read


def test_stats_on_seaweedfs_and_moto(s3_config: dict[str, Any]) -> None:
    """The marker-and-manifest LIST (prefix ``{topic}/.``, delimiter ``/``) and the
    counts as each S3 server answers them."""
    with PawnQueue.from_config(s3_config) as pq:
        pq.create_topic("plain")
        pq.create_topic("packed", packed=True)
        producer = pq.register_producer("p")
        producer.publish_batch("plain", [1, 2, 3])
        producer.publish_batch("packed", [1, 2])
        pq.store.put("plainer/.topicx", b"not a marker")  # a prefix that is no topic
        found = {s.topic: (s.packed, *counts(s)) for s in pq.stats_all()}
        assert found == {"plain": (False, 3, 0, 0, 0), "packed": (True, 2, 0, 0, 0)}
        with pytest.raises(TopicNotFoundError):
            pq.stats("plainer")
