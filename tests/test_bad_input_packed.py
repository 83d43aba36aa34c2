"""tests/test_bad_input.py's bad inputs on a packed topic (issue 14): each ends in a typed
PawnQueueError or a quarantine, and nothing in the bucket is lost or corrupted.

Payloads and topic names run against SeaweedFS, moto and the embedded local store (the
``config`` fixture of test_bad_input); segments, segment leases and failing stores run
on SeaweedFS.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import attrs
import pytest

from pawn_queue_sync import (
    InvalidTopicName,
    PawnQueue,
    PawnQueueError,
    PayloadError,
    PublishError,
    layout,
    packing,
)
from pawn_queue_sync.encoding import canonical_json
from pawn_queue_sync.protocol.segments import Progress, SegmentLease
from tests.credentials import ExpiringCredentials, keyless_config, session_of
from tests.relay import Relay
from tests.servers import ACCESS_KEY, SECRET_KEY, S3Server, config_dict, deep_merge
from tests.test_bad_input import (  # noqa: F401  (config: the fixture, used by name)
    BAD_TOPICS,
    all_keys,
    config,
    reject_bad_payloads,
)

DEADLINE = 60.0
NOW = "2026-01-02T03:04:05+00:00"


@pytest.fixture
def pq(config: dict[str, Any]) -> Iterator[PawnQueue]:  # noqa: F811
    """A started queue with one packed topic, ``t``, and a 1,000-byte message limit."""
    limited = deep_merge(config, {"publishing": {"max_payload_bytes": 1000}})
    with PawnQueue.from_config(limited) as queue:
        queue.create_topic("t", packed=True)
        yield queue


@pytest.fixture
def spq(real_s3: S3Server, real_bucket: str) -> Iterator[PawnQueue]:
    """A started queue on SeaweedFS with one packed topic, ``t``; short leases."""
    cfg = config_dict(real_s3, real_bucket, polling={
        "interval_seconds": 0.2, "jitter_max_ms": 0, "visibility_timeout_seconds": 3.0,
        "lease_refresh_interval_seconds": 0.5})
    with PawnQueue.from_config(cfg) as queue:
        queue.create_topic("t", packed=True)
        yield queue


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def dead_letters(pq: PawnQueue, topic: str = "t") -> dict[str, dict[str, Any]]:
    """The dead letters' ``dead_letter`` info by the key they came from."""
    out = {}
    for key in all_keys(pq, layout.dead_letter_prefix(topic)):
        doc = json.loads(pq.store.get(key).body)
        out[doc["dead_letter"].get("original_key", key)] = doc
    return out


def segment(topic: str, sid: str, lines: list[bytes], **header: Any) -> bytes:
    """A segment's bytes; ``header`` overrides fields of its header line."""
    body = packing.encode_segment(topic, sid, None, NOW, lines)
    if not header:
        return body
    head, rest = body.split(b"\n", 1)
    return canonical_json({**json.loads(head), **header}) + b"\n" + rest


def lines(count: int, tag: str) -> tuple[list[str], list[bytes]]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    return ids, [packing.encode_line(m, None, NOW, {"tag": tag, "n": i})
                 for i, m in enumerate(ids)]


# --------------------------------------------------------------------------- payloads


def test_bad_payloads_on_a_packed_topic_raise_and_write_nothing(pq: PawnQueue) -> None:
    producer = pq.register_producer("p")
    reject_bad_payloads(producer, "t")
    assert all_keys(pq, "t/") == ["t/.packed", "t/.topic"]
    stats = pq.topic_stats("t")
    assert stats["pending"] == 0 and stats["segments"] == 0

    ids = producer.publish_batch("t", [{"n": 0}, {"blob": "a" * 500}])
    assert [m.id for m in pq.register_consumer("c", ["t"]).poll()] == ids


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain"])
@pytest.mark.parametrize("when", ["2020-01-01", 1577836800, object()])
def test_a_created_at_that_is_not_a_datetime_is_a_payload_error(
    pq: PawnQueue, packed: bool, when: Any
) -> None:
    """``created_at`` must be a datetime: anything else is a PayloadError before any
    write (an AttributeError from deep inside the encoding before), on both kinds."""
    topic = "t" if packed else "plain"
    pq.create_topic(topic)
    before = all_keys(pq)
    with pytest.raises(PayloadError, match="created_at must be a datetime"):
        pq.register_producer("p").publish(topic, {"n": 1}, created_at=when)
    assert [k for k in all_keys(pq) if not k.startswith("_registry/")] == [
        k for k in before if not k.startswith("_registry/")]


def test_a_bad_payload_fails_alone_in_a_group_commit(pq: PawnQueue) -> None:
    """Threads publishing at once share segments: the one bad payload among them
    fails its own caller only, and every good one is published once."""
    producer = pq.register_producer("p")
    results: dict[int, Any] = {}
    start = threading.Barrier(9)

    def publish(n: int) -> None:
        start.wait()
        try:
            payload = {"n": {1, 2}} if n == 4 else {"n": n}
            results[n] = producer.publish("t", payload)
        except PawnQueueError as exc:
            results[n] = exc

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert isinstance(results.pop(4), PayloadError)
    assert all(isinstance(mid, str) for mid in results.values()), results
    consumer = pq.register_consumer("c", ["t"])
    got = {m.id: m.payload for m in consumer.poll(20)}
    assert got == {mid: {"n": n} for n, mid in results.items()}


def test_publishes_repeating_a_message_id_are_delivered(
    real_s3: S3Server, real_bucket: str
) -> None:
    """Threads publishing the same ``message_id`` at once (a publish retried while the
    first attempt was still in flight): on a plain topic they overwrite one key and the
    message is delivered; on a packed one it must be delivered too, not dead-lettered."""
    cfg = config_dict(real_s3, real_bucket, publishing={"linger_ms": 1000})
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic("t", packed=True)
        producer = pq.register_producer("p")
        publish_in_threads(producer, 8)  # every thread a recent publisher: one batch
        mid = str(uuid.uuid4())
        seen = publish_in_threads(producer, 8, message_id=mid)
        assert seen == [mid] * 8
        consumer = pq.register_consumer("c", ["t"])
        got = []
        while batch := consumer.poll(20):
            consumer.ack_many(batch)
            got += batch
        assert mid in {m.id for m in got}
        assert pq.topic_stats("t")["dead_letter"] == 0


def test_bad_topic_names_on_create_topic_packed_write_nothing(pq: PawnQueue) -> None:
    before = all_keys(pq)
    for case, topic in BAD_TOPICS.items():
        with pytest.raises(InvalidTopicName) as info:
            pq.create_topic(topic, packed=True)
        assert info.value.topic == topic, case
    assert all_keys(pq) == before
    assert pq.list_topics() == ["t"]


# --------------------------------------------------------------------------- bad objects


def test_foreign_objects_under_segments_are_quarantined(spq: PawnQueue) -> None:
    good = spq.register_producer("p").publish_batch("t", [{"n": n} for n in range(5)])
    foreign = {
        "t/segments/README.txt": b"not a segment at all",
        "t/segments/sub/dir.seg": b"{}",
        "t/segments/20000101T000000_000000-not-a-uuid-n1.seg": b"x",
        f"t/segments/20000101T000000_000000-{uuid.uuid4()}-n0.seg": b"",
    }
    for key, body in foreign.items():
        spq.store.put(key, body)
    consumer = spq.register_consumer("c", ["t"])
    got = consumer.poll(10)
    assert sorted(m.id for m in got) == sorted(good)  # the poll is not broken
    consumer.ack_many(got)
    assert consumer.poll() == []
    dead = dead_letters(spq)
    assert set(dead) == set(foreign)
    for key, body in foreign.items():
        info = dead[key]["dead_letter"]
        assert "foreign" in info["reason"]
        assert base64.b64decode(info["raw_base64"]) == body  # nothing lost
    assert all_keys(spq, "t/segments/") == []
    assert all_keys(spq, "t/segment-leases/") == []


def test_corrupt_and_unknown_version_segments_are_quarantined(spq: PawnQueue) -> None:
    """Segments under well-formed keys whose bytes are wrong are dead-lettered with their
    bytes and a reason that names the problem; the good messages are delivered."""
    good = spq.register_producer("p").publish_batch("t", [{"n": n} for n in range(5)])
    bad: dict[str, tuple[bytes, str]] = {}

    def put(count: int, body: Callable[[str], bytes], reason: str) -> None:
        sid = str(uuid.uuid4())
        key = layout.segment_key("t", "20000101T000000_000000", sid, count)
        bad[key] = (body(sid), reason)
        spq.store.put(key, bad[key][0])

    put(2, lambda sid: b"\xff\x00 not UTF-8 nor JSON\n", "UTF-8")
    put(2, lambda sid: segment("t", sid, lines(2, "v2")[1], version=2), "version")
    put(2, lambda sid: segment("t", sid, lines(2, "fmt")[1], format="other/format"),
        "other/format")
    put(2, lambda sid: segment("other-topic", sid, lines(2, "topic")[1]), "other-topic")
    other = str(uuid.uuid4())
    put(2, lambda sid: segment("t", other, lines(2, "sid")[1]), other)
    put(3, lambda sid: segment("t", sid, lines(3, "cut")[1])[:-20], "truncated")
    put(2, lambda sid: segment("t", sid, [lines(1, "dup")[1][0]] * 2), "repeats")

    consumer = spq.register_consumer("c", ["t"])
    got: list[Any] = []
    wait_for(lambda: bool(got.extend(consumer.poll(10))) or len(got) >= len(good),
             "the good messages")
    assert sorted(m.id for m in got) == sorted(good)
    consumer.ack_many(got)
    wait_for(lambda: consumer.poll() == [] and all_keys(spq, "t/segments/") == [],
             "every bad segment quarantined")
    dead = dead_letters(spq)
    assert set(dead) == set(bad)
    for key, (body, reason) in bad.items():
        info = dead[key]["dead_letter"]
        assert reason in info["reason"], (reason, info["reason"])
        assert base64.b64decode(info["raw_base64"]) == body  # nothing lost
    assert all_keys(spq, "t/segment-leases/") == []


def test_a_corrupt_segment_lease_loses_nothing(spq: PawnQueue) -> None:
    """A segment whose lease holds garbage: polls never fail, and once the lease is stale
    every message of the segment is delivered (its progress is unknown: at least once)
    or dead-lettered with its bytes; nothing is left behind."""
    ids = spq.register_producer("p").publish_batch("t", [{"n": n} for n in range(6)])
    (key,) = all_keys(spq, "t/segments/")
    sid, _ = layout.parse_segment_key("t", key) or ("", 0)
    lease_key = layout.segment_lease_key("t", sid)
    spq.store.put(lease_key, b"\xff garbage, not a lease")
    consumer = spq.register_consumer("c", ["t"])
    delivered: set[str] = set()

    def drained() -> bool:
        msgs = consumer.poll(10)
        delivered.update(m.id for m in msgs)
        consumer.ack_many(msgs)
        return not all_keys(spq, "t/segments/")

    wait_for(drained, "the segment to be consumed once its corrupt lease is stale")
    dead = dead_letters(spq)
    kept = {key} & set(dead)
    assert delivered == set(ids) or kept, (delivered, list(dead))
    for k in kept:
        assert base64.b64decode(dead[k]["dead_letter"]["raw_base64"])
    wait_for(lambda: lease_key not in all_keys(spq, "t/segment-leases/"),
             "the corrupt lease removed")


def test_a_segment_lease_whose_count_disagrees_with_its_segment_loses_nothing(
    spq: PawnQueue
) -> None:
    """A well-formed, released segment lease whose progress counts fewer messages than
    its segment holds (corrupt, or left from other content under the same segment id):
    the messages past its count were never settled and must still be delivered."""
    ids = spq.register_producer("p").publish_batch("t", [{"n": n} for n in range(3)])
    (key,) = all_keys(spq, "t/segments/")
    sid, _ = layout.parse_segment_key("t", key) or ("", 0)
    lease = SegmentLease.new("someone", sid, key, datetime.now(timezone.utc), 3.0,
                             Progress(count=1).settle([0]))
    spq.store.put(layout.segment_lease_key("t", sid), attrs.evolve(lease, released=True)
                  .encode())
    consumer = spq.register_consumer("c", ["t"])
    delivered: set[str] = set()

    def drained() -> bool:
        msgs = consumer.poll(10)
        delivered.update(m.id for m in msgs)
        consumer.ack_many(msgs)
        return not all_keys(spq, "t/segments/")

    wait_for(drained, "the segment consumed")
    assert set(ids[1:]) <= delivered


# --------------------------------------------------------------------------- connection


class Revocable(ExpiringCredentials):
    """The server's keys until revoked, then keys the server does not know."""

    revoked = False

    def current(self) -> dict[str, str]:
        if self.revoked:
            return {"access_key": "revoked-key", "secret_key": "revoked-secret-0123456789"}
        return {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}


def publish_in_threads(producer: Any, threads: int, **kwargs: Any) -> list[Any]:
    """``threads`` publishes at once (one group commit); what each returned or raised."""
    out: list[Any] = [None] * threads
    start = threading.Barrier(threads)

    def run(n: int) -> None:
        start.wait()
        try:
            out[n] = producer.publish("t", {"n": n}, **kwargs)
        except Exception as exc:  # what each caller saw
            out[n] = exc

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(DEADLINE)
    return out


def test_a_packed_publish_with_revoked_credentials_is_a_publish_error(
    real_s3: S3Server, real_bucket: str
) -> None:
    creds = Revocable()
    with PawnQueue(keyless_config(real_s3, real_bucket), session=session_of(creds)) as pq:
        pq.create_topic("t", packed=True)
        producer = pq.register_producer("p")
        creds.revoked = True
        seen = publish_in_threads(producer, 6)
        assert all(isinstance(e, PublishError) for e in seen), seen
        with pytest.raises(PublishError) as info:
            producer.publish_batch("t", [{"n": n} for n in range(5)])
        assert "revoked-secret" not in str(info.value)
        assert all("revoked-secret" not in str(e) for e in seen)
    listed = real_s3.client().list_objects_v2(Bucket=real_bucket, Prefix="t/")
    assert sorted(o["Key"] for o in listed.get("Contents", [])) == ["t/.packed", "t/.topic"]


def test_a_packed_publish_to_an_unreachable_endpoint_is_a_publish_error(
    real_s3: S3Server, real_bucket: str
) -> None:
    proxy = Relay(real_s3.endpoint_url)
    try:
        cfg = config_dict(real_s3, real_bucket, s3={
            "endpoint_url": proxy.endpoint_url, "connect_timeout_seconds": 0.5,
            "max_attempts": 1})
        with PawnQueue.from_config(cfg) as pq:
            pq.create_topic("t", packed=True)
            producer = pq.register_producer("p")
            proxy.stop()  # the endpoint goes away after setup, open connections too
            seen = publish_in_threads(producer, 6)
            assert all(isinstance(e, PublishError) for e in seen), seen
            with pytest.raises(PublishError):
                producer.publish_batch("t", [{"n": n} for n in range(5)])
    finally:
        proxy.stop()
    listed = real_s3.client().list_objects_v2(Bucket=real_bucket, Prefix="t/")
    assert sorted(o["Key"] for o in listed.get("Contents", [])) == ["t/.packed", "t/.topic"]
