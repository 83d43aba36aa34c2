"""Review of issue 16 part A (dead letters, redrive, purge, peek, delete_topic).

The tests above the "mutants" line each reproduce one defect and FAIL at 536a9a5
(e70c645); those below it pass there and kill mutants the part's own tests let
survive (test_pawnqueue_consumes_redriven_messages checks a documented claim)."""

from __future__ import annotations

from typing import Any

import pytest

from pawn_queue_sync import InvalidArgument, PawnQueue, StorageError, layout
from pawn_queue_sync.protocol.lease import Capabilities
from tests.test_cli_regressions import store as store
from tests.test_deadletters import TOPIC, Wrapped, config, keys, wrapped  # noqa: F401


@pytest.mark.parametrize("conditions", [True, False], ids=["conditional", "head-first"])
def test_redrive_during_a_nack_loses_the_message(
    wrapped: tuple[PawnQueue, Wrapped], conditions: bool,  # noqa: F811
) -> None:
    """A consumer nacks: it PUTs the dead letter, then deletes the message. A redrive
    that runs between the two finds the message still at its key (the create is
    refused: "an earlier move, pending"), deletes the dead letter, and then the
    nacker deletes the message: neither the message nor the dead letter is left."""
    pq, store = wrapped
    if not conditions:
        pq.context.caps = Capabilities(if_none_match=False, if_match=False)
    pq.create_topic(TOPIC)
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
    consumer = pq.register_consumer("nacker", [TOPIC])
    (msg,) = consumer.poll()
    _redrive_once_its_dead_letter_is_written(pq, store, mid, lambda: msg.nack("bad order"))


def test_redrive_during_a_dead_letter_at_claim_loses_the_message(
    wrapped: tuple[PawnQueue, Wrapped],  # noqa: F811
) -> None:
    """The same race through the other writer of dead letters: a claim that finds the
    message delivered ``max_delivery_count`` times PUTs its dead letter, then deletes
    the message; a redrive in between deletes the dead letter."""
    pq, store = wrapped
    pq.create_topic(TOPIC)
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
    consumer = pq.register_consumer("c", [TOPIC])
    limit = pq.config.polling.max_delivery_count
    for _ in range(limit):  # each delivery ends in a retry: attempts reach the limit
        (msg,) = consumer.poll()
        consumer.retry(msg, "failing")

    def claim() -> None:
        assert consumer.poll() == []  # dead-lettered at its claim

    _redrive_once_its_dead_letter_is_written(pq, store, mid, claim)


def _redrive_once_its_dead_letter_is_written(pq: PawnQueue, store: Wrapped, mid: str,
                                             dead_letter: Any) -> None:
    """Run ``dead_letter()`` (a writer of ``mid``'s dead letter that deletes the message
    after), with a redrive right after the dead letter's PUT: the message or its dead
    letter must be left."""
    dl_key = layout.dead_letter_key(TOPIC, mid)
    moved: list[Any] = []

    def redrive_now(key: str) -> None:
        if key == dl_key and not moved:  # the dead letter is written
            moved.append(pq.redrive(TOPIC))

    store.after_put = redrive_now
    try:
        dead_letter()
    finally:
        store.after_put = lambda _key: None
    assert moved, "the redrive did not run"
    left = list(keys(pq, layout.messages_prefix(TOPIC))) + list(
        keys(pq, layout.dead_letter_prefix(TOPIC)))
    assert left, f"message {mid} lost: redrive said {moved[0]}, nothing is left"


def test_an_absurdly_small_rate_is_a_typed_error_before_anything_moves(
    tmp_path: Any,
) -> None:
    """rate=1e-300 passes the check (> 0); the first move is made, then the wait
    before the second (1e300 s) is an OverflowError out of time.sleep: an untyped
    error after the bucket changed (a rate of 1e-9 instead waits 31 years)."""
    with PawnQueue({"local": {"path": str(tmp_path / "s")},
                    "polling": {"interval_seconds": 0.05}}) as pq:
        from tests.test_deadletters import dead_lettered
        dead_lettered(pq, TOPIC, 2)
        before = keys(pq)
        try:
            pq.redrive(TOPIC, rate=1e-300)
        except InvalidArgument:
            pass
        except Exception as exc:
            pytest.fail(f"untyped {type(exc).__name__}: {exc}; bucket changed: "
                        f"{keys(pq) != before}")
        assert keys(pq) == before


def test_a_pawnqueue_nack_interrupted_before_its_delete_is_redriven_twice(
    tmp_path: Any,
) -> None:
    """pawn-queue 0.1.3 names a message's key from one clock reading and its
    created_at from another (a few microseconds apart), and its nack copies then
    deletes. When its delete did not happen, the message is still pending under its
    own key; redrive writes a second object for the same id under a key made from
    created_at: the message is delivered twice. (docs/operations.md: 'a nack
    interrupted before its delete is pending anyway and is kept'.)"""
    import json as _json
    import uuid as _uuid
    from datetime import datetime, timedelta, timezone

    with PawnQueue({"local": {"path": str(tmp_path / "s")},
                    "polling": {"interval_seconds": 0.05}}) as pq:
        pq.create_topic(TOPIC)
        mid = str(_uuid.uuid4())
        now = datetime.now(timezone.utc)
        key = layout.message_key(TOPIC, layout.sortable_timestamp(now), mid)
        doc = {"id": mid, "topic": TOPIC, "producer_id": str(_uuid.uuid4()),
               "created_at": (now + timedelta(microseconds=7)).isoformat(),
               "payload": {"n": 1}}
        body = _json.dumps(doc).encode()
        pq.store.put(key, body)                                    # pending, as published
        pq.store.put(layout.dead_letter_key(TOPIC, mid), body)     # its nack's copy
        assert pq.redrive(TOPIC).moved == [mid]
        consumer = pq.register_consumer("c", [TOPIC])
        seen: list[str] = []
        while batch := consumer.poll():
            for m in batch:
                seen.append(m.id)
                m.ack()
        assert seen == [mid], f"delivered {len(seen)} times"


def test_a_redriven_message_is_not_charged_for_its_dead_nackers_lease(
    config: dict[str, Any],  # noqa: F811
) -> None:
    """A nacker that died after deleting the message but before giving back its lease
    leaves the lease (same id). A redrive puts the message back under its original key;
    when the old lease goes stale the janitor counts it as an abandoned delivery of
    the redriven message, which then starts at delivery_count 2 (and with
    max_delivery_count 1 would be dead-lettered again without ever being handled)."""
    import time as _time

    from pawn_queue_sync.config import load_config
    from pawn_queue_sync.storage.factory import build_store
    from tests.servers import deep_merge

    # on SeaweedFS and the local store (the review's ran on the local store only): the
    # janitor compares the lease's ETag as LIST gives it with the one a HEAD gave
    cfg = load_config(deep_merge(config, {
        "polling": {"interval_seconds": 0.05, "jitter_max_ms": 0,
                    "visibility_timeout_seconds": 3.0,
                    "lease_refresh_interval_seconds": 1.0}}))
    store = Wrapped(build_store(cfg))
    pq = PawnQueue(cfg, store=store).setup()  # type: ignore[arg-type]
    try:
        pq.create_topic(TOPIC)
        mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
        nacker = pq.register_consumer("nacker", [TOPIC])
        (msg,) = nacker.poll()
        lease = layout.lease_key(TOPIC, mid)
        store.fail_delete = lambda key: key == lease  # it "died" before this delete
        msg.nack("bad order")
        store.fail_delete = lambda _key: False
        assert lease in keys(pq, layout.leases_prefix(TOPIC))
        assert pq.redrive(TOPIC).moved == [mid]
        consumer = pq.register_consumer("again", [TOPIC])
        end = _time.monotonic() + 30
        got: list[Any] = []
        while not got:
            assert _time.monotonic() < end, "never delivered"
            got = consumer.poll()
            if not got:
                _time.sleep(0.1)
        assert got[0].id == mid
        assert got[0].delivery_count == 1, got[0].body.get("last_error")
    finally:
        pq.teardown()
        store.inner.close()


def test_a_consumer_of_a_topic_deleted_elsewhere_is_not_told(tmp_path: Any) -> None:
    """Review item 7 (ADJUSTED: the docs were corrected, the behaviour kept; the review's
    test expected TopicNotFoundError). docs/operations.md now says: a process keeps a
    topic it used known for its life, so its producer publishes into the deleted topic
    and its consumer polls it without an error; a process started later gets
    TopicNotFoundError. (It used to say consumers fail once they look it up again.)"""
    from pawn_queue_sync import TopicNotFoundError

    cfg = {"local": {"path": str(tmp_path / "s")}, "polling": {"interval_seconds": 0.05}}
    with PawnQueue(cfg) as here, PawnQueue(cfg) as elsewhere:
        here.create_topic(TOPIC)
        producer = here.register_producer("p")
        consumer = here.register_consumer("c", [TOPIC])
        producer.publish(TOPIC, {"n": 0})
        for m in consumer.poll():
            m.ack()
        elsewhere.delete_topic(TOPIC, force=True)
        late = producer.publish(TOPIC, {"n": 1})  # no error: the topic is cached
        assert [m.id for m in consumer.poll()] == [late]
        with PawnQueue(cfg) as later, pytest.raises(TopicNotFoundError):
            later.register_producer("p2").publish(TOPIC, {"n": 2})


@pytest.mark.parametrize("rate", ["inf", "1e-300"])
def test_cli_an_absurd_rate_is_a_usage_error_that_changes_nothing(
    store: Any, rate: str,
) -> None:
    """``--rate inf`` passes argparse (positive_seconds) and fails in the library:
    exit 1, not the usage status 2; ``--rate 1e-300`` moves one, then an OverflowError."""
    from pawn_queue_sync import cli
    from tests.test_cli_deadletters import listing, nacked

    nacked(store, 2)
    before = listing(store)
    proc = store.run("dead-letter", "redrive", TOPIC, "--rate", rate)
    assert proc.returncode == cli.EXIT_USAGE, (proc.returncode, proc.stderr)
    assert listing(store) == before


def _packed_cfg(tmp_path: Any) -> dict[str, Any]:
    return {"local": {"path": str(tmp_path / "s")}, "polling": {"interval_seconds": 0.05}}


def segment_given_back(pq: PawnQueue) -> None:
    """A packed topic of 10 messages whose consumer took 3, acked one, released two and
    closed: its segment lease stays, marked released; 9 messages pending."""
    pq.create_topic(TOPIC, packed=True)
    pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(10)])
    consumer = pq.register_consumer("c", [TOPIC])
    got = consumer.poll(max_messages=3)
    got[0].ack()
    for m in got[1:]:
        m.release()
    consumer.close()


def test_purge_messages_of_a_packed_topic_purges_a_segment_given_back(
    tmp_path: Any,
) -> None:
    """A consumer takes 3 messages of a 10-message segment, acks one, releases two and
    closes: its segment lease stays, marked released (peek shows every message as not
    leased). purge(section="messages") counts any segment-lease object as held, so it
    purges nothing, and the 9 pending messages are delivered after the purge."""
    with PawnQueue(_packed_cfg(tmp_path)) as pq:
        segment_given_back(pq)
        assert not any(m.leased for m in pq.peek(TOPIC, n=20))  # nobody holds them
        purged = pq.purge(TOPIC, section="messages")
        left = pq.register_consumer("after", [TOPIC]).poll(max_messages=20)
        assert (purged, len(left)) == (9, 0)


def _recording_gets(store: Wrapped) -> tuple[list[str], Any]:
    """A list the returned GET appends each key it reads to, and that GET."""
    fetched: list[str] = []
    inner_get = store.inner.get

    def get(key: str, *a: Any, **kw: Any) -> Any:
        fetched.append(key)
        return inner_get(key, *a, **kw)

    return fetched, get


def test_listing_dead_letters_does_not_download_an_object_of_any_size(
    tmp_path: Any,
) -> None:
    """A claim quarantines an object over 4 x publishing.max_payload_bytes found under
    messages/ by a server-side copy into dead-letter/, never reading it (claims.py,
    quarantine_foreign). dead_letters() (and so peek --dead-letter and
    ``pawnq dead-letter list``, and redrive) GETs every dead letter whole, whatever
    its size (the listing gives it): a multi-GB object is read into memory."""
    from pawn_queue_sync.config import load_config
    from pawn_queue_sync.storage.factory import build_store

    cfg = load_config({"local": {"path": str(tmp_path / "s")},
                       "publishing": {"max_payload_bytes": 1024}})
    store = Wrapped(build_store(cfg))
    fetched, get = _recording_gets(store)
    pq = PawnQueue(cfg, store=store).setup()  # type: ignore[arg-type]
    try:
        pq.create_topic(TOPIC)
        big = layout.dead_letter_key(TOPIC, "00000000-0000-4000-8000-000000000000")
        pq.store.put(big, b"x" * (4 * 1024 * 1024))  # 4 MiB: 4096 x max_payload_bytes
        store.inner.get = get  # type: ignore[method-assign]
        letters = list(pq.dead_letters(TOPIC))
        assert len(letters) == 1 and letters[0].payload is None
        assert big not in fetched, "a 4 MiB dead letter was downloaded to be listed"
    finally:
        pq.teardown()
        store.inner.close()


def test_peek_does_not_download_a_pending_object_of_any_size(tmp_path: Any) -> None:
    """The same for peek's pending messages (added with the fix of the test above): a
    4 MiB object under messages/ (max_payload_bytes 1024), not yet moved aside by a
    claim, is shown as too large to read, without a GET."""
    from pawn_queue_sync.config import load_config
    from pawn_queue_sync.storage.factory import build_store

    cfg = load_config({"local": {"path": str(tmp_path / "s")},
                       "publishing": {"max_payload_bytes": 1024}})
    store = Wrapped(build_store(cfg))
    fetched, get = _recording_gets(store)
    pq = PawnQueue(cfg, store=store).setup()  # type: ignore[arg-type]
    try:
        pq.create_topic(TOPIC)
        mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
        big = layout.message_key(TOPIC, "20990101T000000_000000",
                                 "00000000-0000-4000-8000-000000000000")
        pq.store.put(big, b"x" * (4 * 1024 * 1024))
        store.inner.get = get  # type: ignore[method-assign]
        seen = pq.peek(TOPIC, n=5)
        assert [m.id for m in seen if m.payload is not None] == [mid]
        (huge,) = [m for m in seen if m.key == big]
        assert huge.payload is None and "too large" in (huge.error or "")
        assert big not in fetched, "a 4 MiB pending object was downloaded to be peeked"
    finally:
        pq.teardown()
        store.inner.close()


_PQ_CONSUME = """
import asyncio

from pawn_queue import PawnQueue


async def main():
    pq = await PawnQueue.from_config(CONFIG)
    await pq.setup()
    try:
        consumer = await pq.register_consumer("pq-reader", topics=[ARGS["topic"]])
        got = []
        for _ in range(50):
            for m in await consumer.poll():
                got.append(m.id)
                await m.ack()
            if len(got) >= ARGS["n"]:
                break
            await asyncio.sleep(0.1)
        return {"got": got}
    finally:
        await pq.teardown()


emit(asyncio.run(main()))
"""


@pytest.mark.interop
def test_pawnqueue_consumes_redriven_messages(real_s3_config: dict[str, Any]) -> None:
    """docs/operations.md: redriven messages are read by pawn-queue 0.1.x consumers too."""
    from tests.interop import pawnqueue_config, run_pawnqueue
    from tests.servers import deep_merge
    from tests.test_deadletters import FAST, dead_lettered

    with PawnQueue(deep_merge(real_s3_config, FAST)) as pq:
        ids = dead_lettered(pq, "legacy", 3)
        assert sorted(pq.redrive("legacy").moved) == sorted(ids)
    got = run_pawnqueue(_PQ_CONSUME, pawnqueue_config(real_s3_config, "conditional_write"),
                        args={"topic": "legacy", "n": 3})
    assert sorted(got["got"]) == sorted(ids)


# -- tests that pass at 536a9a5 and kill mutants the suite let survive -----------------------


def test_a_message_dead_lettered_by_its_retries_is_redriven_with_its_count_reset(
    tmp_path: Any,
) -> None:
    """Kills 'redrive keeps attempts' (the suite's dead letters all come from nacks,
    which record no attempts): a message retried max_delivery_count times is
    dead-lettered at its claim; after a redrive it is delivered with delivery_count 1
    and a ``redriven`` record (times 1, the reason), not dead-lettered again at once."""
    cfg = {"local": {"path": str(tmp_path / "s")},
           "polling": {"interval_seconds": 0.05, "max_delivery_count": 2}}
    with PawnQueue(cfg) as pq:
        pq.create_topic(TOPIC)
        mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
        consumer = pq.register_consumer("c", [TOPIC])
        for _ in range(2):
            (msg,) = consumer.poll()
            consumer.retry(msg, "boom")
        assert consumer.poll() == []
        (letter,) = pq.dead_letters(TOPIC)
        assert letter.delivery_count == 2 and "boom" in letter.reason
        assert pq.redrive(TOPIC).moved == [mid]
        (again,) = consumer.poll()
        assert again.id == mid and again.delivery_count == 1
        record = again.body["redriven"]
        assert record["times"] == 1 and "boom" in record["reason"]
        assert "last_error" not in again.body and "attempts" not in again.body
        again.ack()


@pytest.mark.parametrize("conditions", [True, False], ids=["conditional", "head-first"])
def test_a_second_redrive_keeps_the_pending_copy_as_it_is(
    wrapped: tuple[PawnQueue, Wrapped], conditions: bool,  # noqa: F811
) -> None:
    """Kills 'the create overwrites': after a redrive crashed before its delete, the
    copy is pending (and may have been retried meanwhile, its attempts recorded); the
    second redrive must not rewrite it (same ETag after)."""
    from tests.test_deadletters import dead_lettered

    pq, store = wrapped
    (mid,) = dead_lettered(pq, TOPIC, 1)
    if not conditions:
        pq.context.caps = Capabilities(if_none_match=False, if_match=False)
    dl_prefix = layout.dead_letter_prefix(TOPIC)
    store.fail_delete = lambda key: key.startswith(dl_prefix)
    assert pq.redrive(TOPIC).moved == []
    store.fail_delete = lambda _key: False
    copy = keys(pq, layout.messages_prefix(TOPIC))
    assert len(copy) == 1
    assert pq.redrive(TOPIC).moved == [mid]
    assert keys(pq, layout.messages_prefix(TOPIC)) == copy


def test_a_message_purged_under_its_handler_comes_back_as_a_dead_letter_when_nacked(
    tmp_path: Any,
) -> None:
    """Review item 8 (ADJUSTED: documented, not changed; the review's test asserted no
    dead letter). docs/operations.md (Purge) said what an ack and a retry of a message
    purged under its handler do, not a nack: the nack writes its dead letter anyway, so
    the purged message comes back as a dead letter, as the docs now say."""
    from pawn_queue_sync.config import load_config
    from pawn_queue_sync.storage.factory import build_store

    cfg = load_config({"local": {"path": str(tmp_path / "s")},
                       "polling": {"interval_seconds": 0.05}})
    store = Wrapped(build_store(cfg))
    pq = PawnQueue(cfg, store=store).setup()  # type: ignore[arg-type]
    try:
        pq.create_topic(TOPIC)
        pq.register_producer("p").publish(TOPIC, {"n": 1})
        consumer = pq.register_consumer("c", [TOPIC])
        claimed: list[Any] = []
        inner_list = store.inner.list

        def listing(prefix: str, *a: Any, **kw: Any) -> Any:
            got = inner_list(prefix, *a, **kw)
            if prefix == layout.leases_prefix(TOPIC) and not claimed:
                claimed.append(None)
                claimed.extend(consumer.poll())  # claimed right after purge's lease listing
            return got

        store.inner.list = listing  # type: ignore[method-assign]
        assert pq.purge(TOPIC, section="messages") == 1
        store.inner.list = inner_list  # type: ignore[method-assign]
        (msg,) = claimed[1:]
        msg.nack("handler failed")
        assert list(keys(pq, layout.dead_letter_prefix(TOPIC))) == [
            layout.dead_letter_key(TOPIC, msg.id)]
        assert keys(pq, layout.messages_prefix(TOPIC)) == {}
    finally:
        pq.teardown()
        store.inner.close()


def test_purge_keeps_a_dead_letter_written_again_after_its_listing(
    wrapped: tuple[PawnQueue, Wrapped],  # noqa: F811
) -> None:
    """Kills 'purge sends no ETags': docs/operations.md, 'A dead letter written after
    the listing stays' (a message that failed again in the meantime)."""
    from tests.test_deadletters import dead_lettered

    pq, store = wrapped
    ids = list(dead_lettered(pq, TOPIC, 3))
    again = layout.dead_letter_key(TOPIC, ids[0])
    body = pq.store.get(again).body.replace(b"bad order", b"failed again")
    inner_list = store.inner.list
    done: list[bool] = []

    def listing(prefix: str, *a: Any, **kw: Any) -> Any:
        got = inner_list(prefix, *a, **kw)
        if prefix == layout.dead_letter_prefix(TOPIC) and not done:
            done.append(True)
            store.inner.put(again, body)  # written again after purge listed it
        return got

    store.inner.list = listing  # type: ignore[method-assign]
    try:
        assert pq.purge(TOPIC) == 2
    finally:
        store.inner.list = inner_list  # type: ignore[method-assign]
    assert list(keys(pq, layout.dead_letter_prefix(TOPIC))) == [again]


def test_a_quarantined_message_is_never_redriven(
    wrapped: tuple[PawnQueue, Wrapped],  # noqa: F811
) -> None:
    """Kills 'quarantined objects count as redrivable': an unreadable object under a
    valid message key is quarantined by a claim (its bytes in ``raw_base64``, payload
    None, the key named by its id); redrive skips it and writes nothing."""
    import uuid as _uuid

    pq, _store = wrapped
    pq.create_topic(TOPIC)
    mid = str(_uuid.uuid4())
    bad = layout.message_key(TOPIC, "20250101T000000_000000", mid)
    pq.store.put(bad, b"{not json")
    assert pq.register_consumer("c", [TOPIC]).poll() == []  # moved aside
    (letter,) = pq.dead_letters(TOPIC)
    assert letter.key == layout.dead_letter_key(TOPIC, mid) and letter.payload is None
    result = pq.redrive(TOPIC)
    assert result.moved == [] and list(result.skipped) == [letter.key]
    assert keys(pq, layout.messages_prefix(TOPIC)) == {}


def test_peek_shows_a_segment_given_back_as_not_leased(tmp_path: Any) -> None:
    """Kills 'a segment with a lease object is always leased' in peek: after its
    consumer acked one, released two and closed, no message of the segment is held."""
    cfg = {"local": {"path": str(tmp_path / "s")}, "polling": {"interval_seconds": 0.05}}
    with PawnQueue(cfg) as pq:
        pq.create_topic(TOPIC, packed=True)
        pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(10)])
        consumer = pq.register_consumer("c", [TOPIC])
        got = consumer.poll(max_messages=3)
        assert all(m.leased for m in pq.peek(TOPIC, n=20))  # held while out
        got[0].ack()
        for m in got[1:]:
            m.release()
        consumer.close()
        seen = pq.peek(TOPIC, n=20)
        assert len(seen) == 9 and not any(m.leased for m in seen)


def test_purge_messages_keeps_a_segment_held_by_a_consumer(tmp_path: Any) -> None:
    """Kills 'purge ignores segment leases': docs/operations.md, 'Nothing leased is
    purged' on a packed topic: a segment whose messages a consumer holds stays, the
    other one goes, and the holder's acks still work."""
    cfg = {"local": {"path": str(tmp_path / "s")}, "polling": {"interval_seconds": 0.05}}
    with PawnQueue(cfg) as pq:
        pq.create_topic(TOPIC, packed=True)
        producer = pq.register_producer("p")
        producer.publish_batch(TOPIC, [{"n": i} for i in range(4)])
        producer.publish_batch(TOPIC, [{"m": i} for i in range(6)])
        assert len(keys(pq, layout.segments_prefix(TOPIC))) == 2
        consumer = pq.register_consumer("c", [TOPIC])
        held = consumer.poll(max_messages=2)
        assert len(held) == 2
        held_segment = {m.key for m in pq.peek(TOPIC, n=20) if m.leased}
        assert len(held_segment) == 1
        purged = pq.purge(TOPIC, section="messages")
        assert set(keys(pq, layout.segments_prefix(TOPIC))) == held_segment
        assert purged in (4, 6)
        consumer.ack_many(held)


def test_redrive_rate_spaces_the_moves_on_the_queues_clock(tmp_path: Any) -> None:
    """Kills 'rate ignored' (the suite's rate test passes rate=1000 and checks no
    spacing): on a FakeClock, 5 moves at 2 a second start 0.5 s apart, so the clock
    has moved 2 s when the redrive returns; without a rate it has not moved."""
    from pawn_queue_sync.clock import FakeClock
    from tests.test_deadletters import dead_lettered

    cfg = {"local": {"path": str(tmp_path / "s")}, "polling": {"interval_seconds": 0.05}}
    with PawnQueue(cfg) as pq:
        dead_lettered(pq, TOPIC, 5)
    clock = FakeClock()
    with PawnQueue(cfg, clock=clock) as pq:
        start = clock.monotonic()
        assert len(pq.redrive(TOPIC, max=2).moved) == 2
        assert clock.monotonic() == start
        assert len(pq.redrive(TOPIC, rate=2.0).moved) == 3
        assert clock.monotonic() - start == pytest.approx(1.0)


def test_delete_topic_interrupted_leaves_a_topic_to_delete_again(
    wrapped: tuple[PawnQueue, Wrapped],  # noqa: F811
) -> None:
    """Kills 'the marker goes first': docs/operations.md, 'the marker last (a crash
    leaves a topic to delete again)'. The contents' DeleteObjects fails: the topic is
    still there, and a second delete_topic(force=True) removes everything."""
    from tests.test_deadletters import dead_lettered

    pq, store = wrapped
    dead_lettered(pq, TOPIC, 2)
    pq.register_producer("p").publish(TOPIC, {"n": 1})
    store.fail_delete = lambda key: layout.parse_message_key(TOPIC, key) is not None
    with pytest.raises(StorageError):
        pq.delete_topic(TOPIC, force=True)
    store.fail_delete = lambda _key: False
    assert layout.topic_marker_key(TOPIC) in keys(pq, f"{TOPIC}/")  # still a topic
    assert pq.delete_topic(TOPIC, force=True) >= 1
    assert keys(pq, f"{TOPIC}/") == {}


def test_delete_topic_without_force_never_deletes_a_message_published_meanwhile(
    wrapped: tuple[PawnQueue, Wrapped],  # noqa: F811
) -> None:
    """Kills 'without force, everything but the marker goes after the check':
    docs/operations.md, 'Without force nothing under messages/ ... is ever deleted: a
    message published in the moment after the check ... stays in the bucket'."""
    pq, store = wrapped
    pq.create_topic(TOPIC)
    producer = pq.register_producer("p")
    inner_list = store.inner.list
    published: list[str] = []
    dead_letter_lists: list[str] = []

    def listing(prefix: str, *a: Any, **kw: Any) -> Any:
        got = inner_list(prefix, *a, **kw)
        if prefix == layout.dead_letter_prefix(TOPIC):
            dead_letter_lists.append(prefix)
            if len(dead_letter_lists) == 2 and not published:  # the check's last LIST
                published.append(producer.publish(TOPIC, {"late": 1}))  # after the check
        return got

    store.inner.list = listing  # type: ignore[method-assign]
    try:
        pq.delete_topic(TOPIC)
    finally:
        store.inner.list = inner_list  # type: ignore[method-assign]
    (mid,) = published
    left = [layout.parse_message_key(TOPIC, k) for k in keys(pq, layout.messages_prefix(TOPIC))]
    assert left == [mid]


def test_dead_letter_usage_line_names_action_and_topic_once() -> None:
    """Review item 12: ``nargs="+"`` made argparse print the usage as
    ``[list|redrive|purge] TOPIC [[list|redrive|purge] TOPIC ...]``."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pawn_queue_sync", "dead-letter", "--help"],
                          capture_output=True, text=True, timeout=60)
    usage = " ".join(proc.stdout.split("\n\n")[0].split())
    assert proc.returncode == 0, proc.stderr
    assert usage.count("[list|redrive|purge] TOPIC") == 1 and "..." not in usage, usage
