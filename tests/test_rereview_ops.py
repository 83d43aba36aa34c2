"""Re-review of issue 16 part A's fixes (674445b..f55a667): the tests above the
"mutants" line each reproduce one defect found, and failed at 3ffa8a6 (the two packed
ones until their fix); those below it kill mutants the earlier tests let survive
(M11, M12, M13, M16 of the re-review)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, layout
from pawn_queue_sync.errors import PawnQueueError
from pawn_queue_sync.protocol.lease import Capabilities

from .test_deadletters import Wrapped, config, keys, wrapped  # noqa: F401
from .test_review_ops import segment_given_back

TOPIC = "orders"


def _redrive_typed(pq: PawnQueue) -> Any:
    """pq.redrive(TOPIC); any error that is not the library's fails the test."""
    try:
        return pq.redrive(TOPIC)
    except PawnQueueError:
        raise
    except Exception as exc:
        pytest.fail(f"redrive raised untyped {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("created_at", [
    "0001-01-01T00:00:00+00:00",          # pending_key: created_at - 2 s
    "9999-12-31T23:59:59.999999+00:00",   # pending_key: created_at + 2 s
    "0001-01-01T00:30:00+01:00",          # message_key_for: astimezone(UTC)
])
def test_redrive_survives_a_dead_letter_with_an_extreme_created_at(
    tmp_path: Any, created_at: str,
) -> None:
    """A dead letter without original_key (pawn-queue 0.1.x's, or a packed topic's)
    whose created_at is near datetime.min/max: pending_key's window (created_at +- 2 s)
    or the key made from it overflows, and the OverflowError (untyped, not a
    StorageError) escapes redrive mid-run: the well-formed letter after it in key
    order is never moved, by this redrive or any later one."""
    with PawnQueue({"local": {"path": str(tmp_path / "s")}}) as pq:
        pq.create_topic(TOPIC)
        odd = "00000000-0000-4000-8000-000000000000"   # first in key order
        good = "ffffffff-0000-4000-8000-000000000000"
        for mid, created in ((odd, created_at), (good, "2026-01-01T00:00:00+00:00")):
            doc = {"id": mid, "topic": TOPIC, "created_at": created,
                   "producer_id": str(uuid.uuid4()), "payload": {"mid": mid}}
            pq.store.put(layout.dead_letter_key(TOPIC, mid), json.dumps(doc).encode())
        result = _redrive_typed(pq)
        assert good in result.moved, result
        assert odd in result.moved or layout.dead_letter_key(TOPIC, odd) in (
            {**result.skipped, **result.failed}), result


def test_purge_of_a_segment_given_back_leaves_no_lease_that_blocks_delete_topic(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """purge(section="messages") now purges a packed segment whose lease was given back
    (070f9b0), but left that released lease behind, with no segment (segments.py's
    rule: "a lease is never deleted while its segment exists" and it is the only
    remover of leases). delete_topic (without force) then refused the emptied topic
    with "live segment leases" although nobody holds anything, until the visibility
    timeout passed and a consumer's poll reaped it."""
    with PawnQueue(config) as pq:
        segment_given_back(pq)
        assert pq.purge(TOPIC, section="messages") == 9
        left = [o.key for o in pq.store.list(f"{TOPIC}/").objects
                if not o.key.endswith((".topic", ".packed"))]
        assert left == [], f"purge left {left}"
        pq.delete_topic(TOPIC)  # raised TopicNotEmptyError (live segment leases)
        assert pq.store.list(f"{TOPIC}/").objects == []


@pytest.mark.parametrize("conditions", [True, False], ids=["conditional", "head-first"])
def test_purge_keeps_the_lease_of_a_segment_taken_over_after_its_read(
    wrapped: tuple[PawnQueue, Wrapped], conditions: bool,  # noqa: F811
) -> None:
    """The given-back lease purge removes is the version it read: a consumer that took
    the segment over in between (its lease rewritten, no longer released) keeps its
    lease (it then finds the segment gone and gives the lease back itself); an
    unconditional delete would remove a live holder's lease under it."""
    pq, store = wrapped
    segment_given_back(pq)
    if not conditions:
        pq.context.caps = Capabilities(if_none_match=False, if_match=False)
    (lease_key,) = keys(pq, layout.segment_leases_prefix(TOPIC))
    inner_delete_many = store.inner.delete_many
    taken: list[str] = []

    def delete_many(batch: list[str], *a: Any, **kw: Any) -> Any:
        if any(k.startswith(layout.segments_prefix(TOPIC)) for k in batch) and not taken:
            doc = json.loads(pq.store.get(lease_key).body)  # a takeover, after purge read it
            doc.update(released=False, consumer_id="taker")
            taken.append(pq.store.put(lease_key, json.dumps(doc).encode()))
        return inner_delete_many(batch, *a, **kw)

    store.inner.delete_many = delete_many  # type: ignore[method-assign]
    assert pq.purge(TOPIC, section="messages") == 9
    store.inner.delete_many = inner_delete_many  # type: ignore[method-assign]
    assert taken and keys(pq, layout.segments_prefix(TOPIC)) == {}
    assert list(keys(pq, layout.segment_leases_prefix(TOPIC))) == [lease_key]
    assert json.loads(pq.store.get(lease_key).body)["consumer_id"] == "taker"



@pytest.mark.parametrize("payload", [b"{\"x\":NaN}", b"\"\\ud800\""], ids=["nan", "surrogate"])
def test_redrive_survives_a_dead_letter_it_cannot_write_back(
    tmp_path: Any, payload: bytes,
) -> None:
    """A dead letter that reads (json.loads takes NaN, which pawn-queue 0.1.x's
    json.dumps writes, and a lone surrogate escape) but that canonical_json cannot
    write back (allow_nan=False; UTF-8 refuses surrogates): redrive raises an untyped
    ValueError / UnicodeEncodeError mid-run, and the letters after it in key order are
    never moved. dead_letters() and peek read it fine."""
    with PawnQueue({"local": {"path": str(tmp_path / "s")}}) as pq:
        pq.create_topic(TOPIC)
        odd = "00000000-0000-4000-8000-000000000000"
        good = "ffffffff-0000-4000-8000-000000000000"
        for mid, body in ((odd, payload), (good, b"{\"n\":1}")):
            doc = (b'{"id":"' + mid.encode() + b'","topic":"orders","created_at":'
                   b'"2026-01-01T00:00:00+00:00","payload":' + body + b"}")
            pq.store.put(layout.dead_letter_key(TOPIC, mid), doc)
        result = _redrive_typed(pq)
        assert good in result.moved, result
        assert layout.dead_letter_key(TOPIC, odd) in {**result.skipped, **result.failed}


def test_redrive_during_a_packed_nack_then_the_nacker_dies_delivers_twice(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """A packed topic's nack PUTs the dead letter, then records the message settled in
    its segment lease. A packed message has no per-message lease for redrive's HEAD
    to see: a redrive in between moved the letter to a single message and deleted the
    letter. If the nacker's process then dies (every later write of it fails), its
    segment lease goes stale with the message unsettled; a takeover delivers it from
    the segment while the redriven single copy is delivered too: two live holders.
    Now a letter is left while its segment's lease does not record its message settled
    (the segment delivers it again), and moved once the segment is gone."""
    import time as _time

    from pawn_queue_sync.errors import StorageError
    from tests.servers import deep_merge
    from tests.test_deadletters import drain

    cfg = deep_merge(config, {"polling": {"visibility_timeout_seconds": 3.0,
                                          "lease_refresh_interval_seconds": 1.0}})

    class Dying(Wrapped):
        dead = False

        def put(self, key: str, *a: Any, **kw: Any) -> Any:
            if self.dead:
                raise StorageError("injected: the process is dead", key=key)
            result = self.inner.put(key, *a, **kw)
            self.after_put(key)
            return result

    with PawnQueue(cfg) as other:
        other.create_topic(TOPIC, packed=True)
        other.register_producer("p").publish_batch(TOPIC, [{"n": 1}])
        store = Dying(other.store)
        pq = PawnQueue(cfg, store=store).setup()  # type: ignore[arg-type]
        consumer = pq.register_consumer("nacker", [TOPIC])
        (msg,) = consumer.poll()
        dl_key = layout.dead_letter_key(TOPIC, msg.id)
        moved: list[Any] = []

        def redrive_now(key: str) -> None:
            if key == dl_key and not moved:
                moved.append(other.redrive(TOPIC))
                store.dead = True  # the nacker dies right after its dead-letter PUT

        store.after_put = redrive_now
        with pytest.raises(StorageError):
            msg.nack("bad")
        assert moved, "the redrive did not run"
        held: list[Any] = []
        end = _time.monotonic() + 20
        a = other.register_consumer("a", [TOPIC])
        # until the segment delivers it again (its nacker's lease gone stale)
        while _time.monotonic() < end and msg.key not in {m.key for m in held}:
            for m in held:
                m.refresh()  # each delivery stays live: never acked, never stale
            held += [m for m in a.poll(max_messages=10) if m.id == msg.id]
            _time.sleep(0.1)
        store.after_put = lambda _key: None
        live = sorted({m.key for m in held})
        assert len(live) <= 1, f"{msg.id} held twice at once, from {live}"
        assert live == [msg.key], "its segment never delivered it again"
        assert moved[0].moved == [] and dl_key in moved[0].skipped, moved[0]
        assert other.redrive(TOPIC).moved == []  # held from its segment: left again
        assert [m.id for m in a.poll(max_messages=10)] == []
        held[0].ack()  # its segment's last message: the segment is deleted
        assert keys(other, layout.segments_prefix(TOPIC)) == {}
        assert other.redrive(TOPIC).moved == [msg.id]  # now it goes back, once more
        assert list(drain(a, {msg.id}, lambda m: m.ack())) == [msg.id]
        assert keys(other, f"{TOPIC}/messages/") == {}
        assert keys(other, layout.dead_letter_prefix(TOPIC)) == {}


def _two_in_a_segment(pq: PawnQueue) -> tuple[list[str], Any, Any]:
    """A packed topic of one segment of 2 messages, both taken by consumer "c": the
    ids, and the two messages held."""
    pq.create_topic(TOPIC, packed=True)
    ids = pq.register_producer("p").publish_batch(TOPIC, [{"n": 0}, {"n": 1}])
    first, second = pq.register_consumer("c", [TOPIC]).poll(max_messages=2)
    return ids, first, second


def test_a_packed_letter_moves_while_its_segment_is_held_once_its_nack_is_recorded(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """The segment's lease records the nacked message settled: its letter moves at
    once, while the segment is still held for its other message (which the redrive
    leaves alone); the moved message is delivered once, the other once."""
    from tests.test_deadletters import drain

    with PawnQueue(config) as pq:
        ids, first, second = _two_in_a_segment(pq)
        first.nack("bad order")
        assert pq.redrive(TOPIC).moved == [first.id]
        assert len(keys(pq, layout.segments_prefix(TOPIC))) == 1  # still held
        got = drain(pq.register_consumer("d", [TOPIC]), {first.id}, lambda m: m.ack())
        assert list(got) == [first.id]
        second.ack()
        assert sorted(ids) == sorted([first.id, second.id])
        assert [o.key for o in pq.store.list(f"{TOPIC}/").objects
                if not o.key.endswith((".topic", ".packed"))] == []


def test_a_packed_letter_waits_while_its_segment_is_there_without_a_lease(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """A segment with no lease (removed by hand here) is claimed afresh, each of its
    messages delivered again, the nacked one too: its letter is left until the
    segment is gone, then moved."""
    from tests.test_deadletters import drain

    with PawnQueue(config) as pq:
        ids, first, _second = _two_in_a_segment(pq)
        first.nack("bad order")
        (lease_key,) = keys(pq, layout.segment_leases_prefix(TOPIC))
        pq.store.delete(lease_key)
        result = pq.redrive(TOPIC)
        assert result.moved == [], result
        assert list(result.skipped) == [layout.dead_letter_key(TOPIC, first.id)]
        d = pq.register_consumer("d", [TOPIC])
        assert sorted(drain(d, set(ids), lambda m: m.ack())) == sorted(ids)
        assert keys(pq, layout.segments_prefix(TOPIC)) == {}
        assert pq.redrive(TOPIC).moved == [first.id]
        assert list(drain(d, {first.id}, lambda m: m.ack())) == [first.id]


def test_a_packed_letter_waits_while_its_segments_lease_cannot_be_read(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """A segment lease that does not decode cannot say the nacked message is settled
    (and its next holder takes the segment over afresh, delivering every message
    again): the letter is left."""
    with PawnQueue(config) as pq:
        _ids, first, _second = _two_in_a_segment(pq)
        first.nack("bad order")
        (lease_key,) = keys(pq, layout.segment_leases_prefix(TOPIC))
        pq.store.put(lease_key, b"not a segment lease")
        result = pq.redrive(TOPIC)
        assert result.moved == [], result
        assert list(result.skipped) == [layout.dead_letter_key(TOPIC, first.id)]


# -- mutants: tests that pass at 3ffa8a6 and kill mutants the earlier tests let survive ------


def test_purge_keeps_a_segment_whose_lease_cannot_be_read(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """Kills M11 ('an unreadable segment lease counts as not held'): a segment lease
    that does not decode cannot tell whether a consumer holds its segment, so
    purge(section="messages") keeps the segment and the lease."""
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC, packed=True)
        pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(5)])
        (segment,) = keys(pq, layout.segments_prefix(TOPIC))
        parsed = layout.parse_segment_key(TOPIC, segment)
        assert parsed is not None
        lease_key = layout.segment_lease_key(TOPIC, parsed[0])
        pq.store.put(lease_key, b"not a segment lease")
        assert pq.purge(TOPIC, section="messages") == 0
        assert list(keys(pq, layout.segments_prefix(TOPIC))) == [segment]
        assert list(keys(pq, layout.segment_leases_prefix(TOPIC))) == [lease_key]


def _pawnqueue_letter(pq: PawnQueue, mid: str, created: datetime) -> None:
    """A pawn-queue 0.1.x dead letter of ``mid``: a plain copy of the message."""
    doc = {"id": mid, "topic": TOPIC, "created_at": created.isoformat(),
           "producer_id": None, "payload": {"mid": mid}}
    pq.store.put(layout.dead_letter_key(TOPIC, mid), json.dumps(doc).encode())


def _message_at(pq: PawnQueue, when: datetime, mid: str, body: bytes = b"{}") -> str:
    key = layout.message_key(TOPIC, layout.sortable_timestamp(when), mid)
    pq.store.put(key, body)
    return key


def test_a_pawnqueue_letters_pending_lookup_reads_no_page_past_its_window() -> None:
    """Kills M12 ('pending_key does not stop past created_at + 2 s'): looking for a
    pawn-queue 0.1.x letter's pending message is one LIST of message keys when its
    window holds fewer than 1,000 keys: 2,500 messages a minute later (3 pages) are
    never read."""
    from pawn_queue_sync.testing import memory_queue

    lists: list[str] = []

    def hook(op: str, key: str) -> None:
        if op == "list" and key == layout.messages_prefix(TOPIC):
            lists.append(key)

    created = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with memory_queue(topics=[TOPIC], hooks=hook) as pq:
        for i in range(2500):
            _message_at(pq, created + timedelta(minutes=1, microseconds=i), str(uuid.uuid4()))
        mid = str(uuid.uuid4())
        _pawnqueue_letter(pq, mid, created)
        lists.clear()
        assert pq.redrive(TOPIC).moved == [mid]
        assert len(lists) == 1, f"{len(lists)} LISTs of {TOPIC}/messages/"


def test_a_pawnqueue_letters_pending_message_is_found_past_a_full_page() -> None:
    """Kills M13 (NEAR_PAGES = 1): 1,500 message keys within 2 s before the pending
    copy of a pawn-queue letter's message (a nack interrupted before its delete): the
    lookup reads a second page, finds it and keeps it; no second copy is written."""
    from pawn_queue_sync.testing import memory_queue

    created = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with memory_queue(topics=[TOPIC]) as pq:
        for i in range(1500):
            _message_at(pq, created - timedelta(seconds=1, microseconds=-i), str(uuid.uuid4()))
        mid = str(uuid.uuid4())
        pending = _message_at(pq, created + timedelta(microseconds=120), mid, json.dumps(
            {"id": mid, "topic": TOPIC, "created_at": created.isoformat(),
             "producer_id": None, "payload": {"mid": mid}}).encode())
        _pawnqueue_letter(pq, mid, created)
        assert pq.redrive(TOPIC).moved == [mid]
        copies = [k for k in keys(pq, layout.messages_prefix(TOPIC))
                  if layout.parse_message_key(TOPIC, k) == mid]
        assert copies == [pending]


def test_dead_letters_reads_a_quarantined_object_of_the_largest_size_kept_inline(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """Kills M16 (largest_readable = max_payload_bytes + 64 KiB): a claim keeps a
    foreign object of up to 4 x max_payload_bytes inline (base64, 4/3 as long) in its
    dead letter; dead_letters() reads such a letter whole, its bytes included, rather
    than call it too large to read."""
    import base64
    import os

    from tests.servers import deep_merge

    most = 100_000
    with PawnQueue(deep_merge(config, {"publishing": {"max_payload_bytes": most}})) as pq:
        pq.create_topic(TOPIC)
        raw = os.urandom(4 * most)
        pq.store.put(f"{TOPIC}/messages/not-a-message-key.bin", raw)
        assert pq.register_consumer("c", [TOPIC]).poll() == []  # moved aside
        (letter,) = pq.dead_letters(TOPIC)
        assert "too large" not in letter.reason, letter.reason
        assert letter.raw is not None
        assert base64.b64decode(letter.raw["dead_letter"]["raw_base64"]) == raw
