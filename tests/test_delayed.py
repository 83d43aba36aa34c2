"""Delayed messages on SeaweedFS and the local store, counting messages (issue 16): none
early (by the server's clock: each promoted object is written no sooner than its
delayed object's LastModified plus the delay), none lost, none twice; publish and
retry delays on plain and packed topics; many promoters at once; a crash between a
promotion's copy and its delete, and between a delayed retry's write and its delete."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from pawn_queue_sync import Message, PawnQueue, StorageError, TopicNotEmptyError, cli, layout
from pawn_queue_sync.queue import promotion
from pawn_queue_sync.queue.consumer import Consumer
from tests.servers import deep_merge
from tests.test_cli_regressions import Store, store  # noqa: F401  (the fixture)
from tests.test_deadletters import Wrapped, config, wrapped  # noqa: F401  (fixtures)

TOPIC = "later"
#: Seconds a test waits for messages it counts before calling them lost.
DEADLINE = 90.0


def delayed_written(pq: PawnQueue, topic: str = TOPIC) -> dict[str, datetime]:
    """Message id -> its delayed object's LastModified (the server's)."""
    out: dict[str, datetime] = {}
    for info in pq.store.list(layout.delayed_prefix(topic)).objects:
        name = layout.parse_delayed_key(topic, info.key)
        assert name is not None and info.last_modified is not None, info
        out[name.message_id] = info.last_modified
    return out


def publish_delayed(pq: PawnQueue, n: int, delay: float) -> tuple[set[str], dict[str, datetime]]:
    """``n`` messages published delayed by ``delay`` into a new topic: their ids, and
    their delayed objects' LastModified by id."""
    pq.create_topic(TOPIC)
    producer = pq.register_producer("p")
    ids = {producer.publish(TOPIC, {"n": i}, delay_seconds=delay) for i in range(n)}
    return ids, delayed_written(pq)


class Deliveries:
    """Every delivery a test's consumers got, by id, with the promoted object's
    LastModified when it was a message of its own (read before it is settled)."""

    def __init__(self, pq: PawnQueue) -> None:
        self.pq = pq
        self.count: Counter[str] = Counter()
        self.written: dict[str, datetime] = {}
        self.counts: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def record(self, msg: Message) -> None:
        written = None
        if msg.segment is None:
            written = self.pq.store.head(msg.key).last_modified
        with self.lock:
            self.count[msg.id] += 1
            self.counts.setdefault(msg.id, []).append(msg.delivery_count)
            if written is not None:
                self.written[msg.id] = written


def consume(consumer: Consumer, seen: Deliveries, want: set[str],
            settle: Callable[[Message], None] = Message.ack) -> None:
    """Poll until every id of ``want`` was delivered, settling each with ``settle``."""
    end = time.monotonic() + DEADLINE
    while not want <= set(seen.count):
        assert time.monotonic() < end, f"never delivered: {want - set(seen.count)}"
        for msg in consumer.poll(max_messages=50):
            seen.record(msg)
            settle(msg)


def consume_times(consumer: Consumer, seen: Deliveries, mid: str, times: int) -> None:
    """Poll (acking) until ``mid`` was delivered ``times`` times in all."""
    end = time.monotonic() + DEADLINE
    while seen.count[mid] < times:
        assert time.monotonic() < end, f"{mid} delivered {seen.count[mid]} times"
        for msg in consumer.poll():
            seen.record(msg)
            msg.ack()


def not_early(seen: Deliveries, written: dict[str, datetime], delay: float) -> None:
    """Each promoted object was written no sooner than its delayed one plus the delay,
    by the server's clock (S3 gives both to the second: an integer delay compares)."""
    for mid, at in written.items():
        assert seen.written[mid] >= at + timedelta(seconds=delay), (mid, at, seen.written)


def nothing_left(pq: PawnQueue, topic: str = TOPIC) -> None:
    left = [o.key for o in pq.store.list(f"{topic}/").objects
            if not o.key.endswith((layout.TOPIC_MARKER, layout.PACKED_MANIFEST))]
    assert left == [], left


# -- publish(delay_seconds=...) ------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_delayed_messages_come_once_and_never_early(config: dict[str, Any],  # noqa: F811
                                                    packed: bool) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        later = {producer.publish(TOPIC, {"n": i}, delay_seconds=3) for i in range(20)}
        now = set(producer.publish_batch(TOPIC, [{"now": i} for i in range(5)]))
        written = delayed_written(pq)
        assert set(written) == later
        consumer = pq.register_consumer("c", [TOPIC])
        seen = Deliveries(pq)
        consume(consumer, seen, now)  # the others are not held up
        consume(consumer, seen, later | now)
        assert set(seen.count) == later | now and set(seen.count.values()) == {1}
        not_early(seen, written, 3)
        assert all(seen.counts[m] == [1] for m in later)
        assert consumer.poll() == []
        nothing_left(pq)


def test_a_listener_gets_delayed_messages_once_due(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue(config) as pq:
        ids, written = publish_delayed(pq, 10, 2)
        seen = Deliveries(pq)
        done = threading.Event()

        def handler(msg: Message) -> None:
            seen.record(msg)
            if set(seen.count) >= ids:
                done.set()

        consumer = pq.register_consumer("listener", [TOPIC])
        thread = threading.Thread(target=consumer.listen, args=(handler,),
                                  kwargs={"stop_event": done, "max_workers": 4,
                                          "install_signal_handlers": False})
        thread.start()
        thread.join(DEADLINE)
        assert not thread.is_alive() and done.is_set(), set(ids) - set(seen.count)
        assert set(seen.count) == ids and set(seen.count.values()) == {1}
        not_early(seen, written, 2)
        nothing_left(pq)


# -- retry(delay_seconds=...) --------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_a_delayed_retry_comes_back_once_after_its_delay(config: dict[str, Any],  # noqa: F811
                                                         packed: bool) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC, packed=packed)
        ids = set(pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(8)]))
        consumer = pq.register_consumer("c", [TOPIC])
        first = Deliveries(pq)
        consume(consumer, first, ids, lambda m: m.retry(delay_seconds=2, error="try later"))
        assert set(first.count.values()) == {1}
        written = delayed_written(pq)
        assert set(written) == ids
        assert pq.store.list(layout.messages_prefix(TOPIC)).objects == []
        again = Deliveries(pq)
        got: dict[str, Message] = {}

        def keep(msg: Message) -> None:
            got[msg.id] = msg
            msg.ack()

        consume(consumer, again, ids, keep)
        assert set(again.count) == ids and set(again.count.values()) == {1}
        not_early(again, written, 2)
        for msg in got.values():
            assert msg.delivery_count == 2 and msg.body["last_error"] == "try later"
            assert msg.body["attempts"] == 1 and msg.payload["n"] in range(8)
        assert consumer.poll() == []
        nothing_left(pq)


def test_a_delayed_retry_counts_towards_max_delivery_count(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue(deep_merge(config, {"polling": {"max_delivery_count": 2}})) as pq:
        pq.create_topic(TOPIC)
        [mid] = pq.register_producer("p").publish_batch(TOPIC, [{"n": 1}])
        consumer = pq.register_consumer("c", [TOPIC])
        seen = Deliveries(pq)
        end = time.monotonic() + DEADLINE
        while seen.count[mid] < 2:
            assert time.monotonic() < end, f"delivered {seen.count[mid]} times"
            for msg in consumer.poll():
                seen.record(msg)
                msg.retry(delay_seconds=1, error="no")
        while not pq.store.list(layout.dead_letter_prefix(TOPIC)).objects:
            assert time.monotonic() < end, "never dead-lettered"
            assert consumer.poll() == []  # delivered twice: the third claim dead-letters
        assert seen.counts[mid] == [1, 2]
        [letter] = list(pq.dead_letters(TOPIC))
        assert letter.id == mid and "no" in letter.reason


# -- many promoters ------------------------------------------------------------------------


def test_many_promoters_at_once_deliver_each_message_once(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue(config) as pq:
        ids, written = publish_delayed(pq, 120, 2)
        seen = Deliveries(pq)
        consumers = [pq.register_consumer(f"c{i}", [TOPIC]) for i in range(6)]
        errors: list[BaseException] = []

        def run(consumer: Consumer) -> None:
            try:
                consume(consumer, seen, ids)
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert set(seen.count) == ids and max(seen.count.values()) == 1, seen.count
        not_early(seen, written, 2)
        nothing_left(pq)


# -- crashes -------------------------------------------------------------------------------


def copied_not_deleted(pq: PawnQueue, faulty: Wrapped) -> str:
    """A delayed message promoted by a promoter that died after its copy, before its
    delete: its id (both objects are there)."""
    pq.create_topic(TOPIC)
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=1)
    faulty.fail_delete = lambda key: key.startswith(layout.delayed_prefix(TOPIC))
    end = time.monotonic() + DEADLINE
    while not pq.store.list(layout.messages_prefix(TOPIC)).objects:
        assert time.monotonic() < end, "never promoted"
        promotion.promote_due(pq.context, TOPIC)  # copies, then "dies" before its delete
    assert list(delayed_written(pq)) == [mid]
    faulty.fail_delete = lambda _key: False
    return mid


def test_a_promotion_interrupted_after_its_copy_is_finished_by_the_next(
    wrapped: tuple[PawnQueue, Wrapped]  # noqa: F811
) -> None:
    pq, faulty = wrapped
    mid = copied_not_deleted(pq, faulty)
    assert promotion.promote_due(pq.context, TOPIC).promoted == 1  # finds it copied
    assert delayed_written(pq) == {}
    consumer = pq.register_consumer("c", [TOPIC])
    seen = Deliveries(pq)
    consume(consumer, seen, {mid})
    assert consumer.poll() == [] and seen.count == {mid: 1}
    nothing_left(pq)


def test_the_window_that_repeats_a_message_loses_none(
    wrapped: tuple[PawnQueue, Wrapped]  # noqa: F811
) -> None:
    """docs/guarantees.md: a promoter stalled between its copy and its delete while
    the copy is consumed and acked, then another promoter: delivered twice, not lost."""
    pq, faulty = wrapped
    mid = copied_not_deleted(pq, faulty)
    consumer = pq.register_consumer("c", [TOPIC])
    seen = Deliveries(pq)
    faulty.fail_delete = lambda key: key.startswith(layout.delayed_prefix(TOPIC))
    consume(consumer, seen, {mid})  # consumed and acked while the delayed one stays
    faulty.fail_delete = lambda _key: False  # the stalled promoter, or another, goes on
    assert promotion.promote_due(pq.context, TOPIC).promoted == 1
    consume_times(consumer, seen, mid, 2)
    assert seen.count == {mid: 2}
    nothing_left(pq)


def test_a_delayed_retry_interrupted_before_its_delete_repeats_never_loses(
    wrapped: tuple[PawnQueue, Wrapped]  # noqa: F811
) -> None:
    pq, faulty = wrapped
    pq.create_topic(TOPIC)
    [mid] = pq.register_producer("p").publish_batch(TOPIC, [{"n": 1}])
    consumer = pq.register_consumer("c", [TOPIC])
    [msg] = consumer.poll()
    faulty.fail_delete = lambda key: key.startswith(layout.messages_prefix(TOPIC))
    with pytest.raises(StorageError, match="injected"):
        msg.retry(delay_seconds=1, error="x")
    faulty.fail_delete = lambda _key: False
    assert list(delayed_written(pq)) == [mid]  # written first: nothing lost
    assert msg.state == "leased"
    msg.release()  # the process would have died: its lease gives it back
    seen = Deliveries(pq)
    consume_times(consumer, seen, mid, 2)
    assert seen.count == {mid: 2}
    nothing_left(pq)


# -- topics --------------------------------------------------------------------------------


def test_delete_topic_refuses_while_delayed_messages_wait(config: dict[str, Any]) -> None:  # noqa: F811
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC)
        mid = pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=3600)
        with pytest.raises(TopicNotEmptyError, match="delayed messages"):
            pq.delete_topic(TOPIC)
        assert pq.topic_exists(TOPIC) and list(delayed_written(pq)) == [mid]
        assert pq.delete_topic(TOPIC, force=True) == 2  # the delayed message, the marker
        assert pq.store.list(f"{TOPIC}/").objects == []


# -- the CLI -------------------------------------------------------------------------------


def test_pawnq_publish_delay(store: Store) -> None:  # noqa: F811
    ok = store.run("publish", "--create", "--delay", "30", TOPIC, '{"n": 1}', '{"n": 2}')
    assert ok.returncode == cli.EXIT_OK, ok.stderr
    ids = ok.stdout.split()
    with store.queue() as pq:
        assert set(delayed_written(pq)) == set(ids) and len(ids) == 2
        assert pq.store.list(layout.messages_prefix(TOPIC)).objects == []
        before = {o.key for o in pq.store.list("").objects}
    for bad in ("-1", "nan", "inf", "soon"):
        proc = store.run("publish", "--delay", bad, TOPIC, '{"n": 3}')
        assert proc.returncode == cli.EXIT_USAGE and "--delay" in proc.stderr, proc.stderr
    proc = store.run("publish", "--delay", "700000", TOPIC, '{"n": 3}')
    assert proc.returncode == cli.EXIT_ERROR and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "PayloadError" in lines[0] and "max_delay" in lines[0], lines
    with store.queue() as pq:
        assert {o.key for o in pq.store.list("").objects} == before


def test_delayed_and_retried_on_both_servers(s3_config: dict[str, Any]) -> None:
    """moto too (it ignores If-None-Match on a copy: a second promoter's copy would
    overwrite, not be refused; one promoter here): each message once, none early."""
    with PawnQueue(deep_merge(s3_config, {"polling": {"interval_seconds": 0.05}})) as pq:
        ids, written = publish_delayed(pq, 5, 1)
        consumer = pq.register_consumer("c", [TOPIC])
        first = Deliveries(pq)
        consume(consumer, first, ids, lambda m: m.retry(delay_seconds=1, error="again"))
        not_early(first, written, 1)
        again = Deliveries(pq)
        consume(consumer, again, ids)
        assert set(first.count.values()) == set(again.count.values()) == {1}
        assert all(again.counts[m] == [2] for m in ids)
        nothing_left(pq)
