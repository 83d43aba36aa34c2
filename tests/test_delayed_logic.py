"""Delayed messages, the logic (issue 16): arguments, when a message is due (by the
server's clock only), what a promotion pass costs and reads, on a MemoryStore under a
manual FakeClock, so "not a microsecond early" is exact."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pawn_queue_sync import InvalidArgument, PayloadError, StorageError, layout
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.config import load_config
from pawn_queue_sync.errors import ConfigError
from pawn_queue_sync.queue import delayed, idle, promotion
from pawn_queue_sync.queue.core import PawnQueue
from pawn_queue_sync.storage.base import Listing
from pawn_queue_sync.storage.memory import MemoryStore
from pawn_queue_sync.testing import memory_queue

TOPIC = "jobs"
#: A start with a fraction of a second: the memory store's LastModified is exact.
START = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def ops() -> Counter[tuple[str, str]]:
    """(operation, prefix section) -> how many times the store was asked."""
    return Counter()


@pytest.fixture
def pq(clock: FakeClock, ops: Counter[tuple[str, str]]) -> Iterator[PawnQueue]:
    def hook(op: str, key: str) -> None:
        parts = key.split("/")
        ops[(op, parts[1] if len(parts) > 1 else parts[0])] += 1

    with memory_queue({"polling": {"interval_seconds": 1.0}}, topics=[TOPIC], clock=clock,
                      hooks=hook) as queue:
        yield queue


def keys(pq: PawnQueue, section: str) -> list[str]:
    return [o.key for o in pq.store.list(f"{TOPIC}/{section}/").objects]


def everything(pq: PawnQueue) -> dict[str, str]:
    return {o.key: o.etag for o in pq.store.list("").objects
            if not o.key.startswith("_registry/")}


# -- arguments -------------------------------------------------------------------------------


BAD_DELAYS: list[Any] = [-1, -0.001, math.nan, math.inf, -math.inf, True, False, "10",
                         604800.001, 10**400, [5]]


@pytest.mark.parametrize("bad", BAD_DELAYS, ids=repr)
def test_a_bad_delay_is_a_payload_error_and_writes_nothing(pq: PawnQueue, bad: Any) -> None:
    before = everything(pq)
    with pytest.raises(PayloadError, match="delay_seconds"):
        pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=bad)
    assert everything(pq) == before


def test_delays_up_to_seven_days_by_default_and_zero_is_no_delay(pq: PawnQueue) -> None:
    producer = pq.register_producer("p")
    producer.publish(TOPIC, {"n": 1}, delay_seconds=604800)
    producer.publish(TOPIC, {"n": 2}, delay_seconds=0)
    [week] = keys(pq, "delayed")
    assert week.endswith("-d604800000.json")
    assert len(keys(pq, "messages")) == 1


def test_max_delay_is_a_setting(clock: FakeClock) -> None:
    cfg = {"publishing": {"max_delay_seconds": 30 * 86400}}
    with memory_queue(cfg, topics=[TOPIC], clock=clock) as pq:
        producer = pq.register_producer("p")
        producer.publish(TOPIC, {"n": 1}, delay_seconds=29 * 86400)
        with pytest.raises(PayloadError, match=r"publishing\.max_delay_seconds"):
            producer.publish(TOPIC, {"n": 1}, delay_seconds=31 * 86400)
    assert load_config({}).publishing.max_delay_seconds == 604800
    with pytest.raises(ConfigError, match=r"publishing\.max_delay_seconds"):
        load_config({"publishing": {"max_delay_seconds": 11 * 365 * 86400}})


@pytest.mark.parametrize("bad", [-5, math.nan, math.inf, True, 604801], ids=repr)
def test_a_bad_retry_delay_is_invalid_argument_and_changes_nothing(
    pq: PawnQueue, bad: Any
) -> None:
    pq.register_producer("p").publish(TOPIC, {"n": 1})
    consumer = pq.register_consumer("c", [TOPIC])
    [msg] = consumer.poll()
    before = everything(pq)
    with pytest.raises(InvalidArgument, match="delay_seconds"):
        msg.retry(delay_seconds=bad)
    assert everything(pq) == before and msg.state == "leased"
    msg.ack()


def test_a_created_at_past_the_calendar_is_refused(pq: PawnQueue) -> None:
    before = everything(pq)
    late = datetime(9999, 12, 31, 23, 0, tzinfo=timezone.utc)
    with pytest.raises(PayloadError, match="calendar"):
        pq.register_producer("p").publish(TOPIC, 1, created_at=late, delay_seconds=86400)
    assert everything(pq) == before


# -- when a message is due -----------------------------------------------------------------


def test_a_delayed_message_is_promoted_exactly_at_last_modified_plus_delay(
    pq: PawnQueue, clock: FakeClock
) -> None:
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=10)
    [key] = keys(pq, "delayed")
    written = pq.store.head(key).last_modified
    assert keys(pq, "messages") == []
    clock.advance(10 - 1e-6)
    assert promotion.promote_due(pq.context, TOPIC).promoted == 0
    assert keys(pq, "messages") == []
    clock.advance(1e-6)
    assert pq.store.server_time() == written + timedelta(seconds=10)
    assert promotion.promote_due(pq.context, TOPIC).promoted == 1
    [moved] = keys(pq, "messages")
    assert layout.parse_message_key(TOPIC, moved) == mid and keys(pq, "delayed") == []


def test_a_last_modified_given_to_the_second_waits_one_second_more() -> None:
    whole = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert not promotion.is_due(whole, 5000, whole + timedelta(seconds=5))
    assert not promotion.is_due(whole, 5000, whole + timedelta(seconds=5.999))
    assert promotion.is_due(whole, 5000, whole + timedelta(seconds=6))
    exact = whole + timedelta(microseconds=1)
    assert promotion.is_due(exact, 5000, exact + timedelta(seconds=5))
    assert not promotion.is_due(None, 1, whole) and not promotion.is_due(whole, 1, None)


class NoServerTime(MemoryStore):
    """A store that never says what time it is (no Date header anywhere)."""

    def list(self, prefix: str, **kwargs: Any) -> Listing:
        listing = super().list(prefix, **kwargs)
        return Listing(listing.objects, listing.prefixes, None, listing.truncated)

    def server_time(self) -> None:  # type: ignore[override]
        return None


def test_without_a_server_time_nothing_is_promoted(clock: FakeClock) -> None:
    store = NoServerTime(clock)
    pq = PawnQueue(load_config({}), store=store, clock=clock).setup()
    try:
        pq.create_topic(TOPIC)
        pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=1)
        clock.advance(3600)  # the client's clock says it is long due
        assert promotion.promote_due(pq.context, TOPIC).promoted == 0
        assert keys(pq, "messages") == [] and len(keys(pq, "delayed")) == 1
    finally:
        pq.close()


# -- what a pass costs and reads -------------------------------------------------------------


@pytest.mark.parametrize("n", [10, 1000])
def test_an_idle_topic_of_future_messages_costs_one_short_list_and_no_read(
    pq: PawnQueue, clock: FakeClock, ops: Counter[tuple[str, str]], n: int
) -> None:
    """Each idle poll: one LIST of the topic from delayed/ on (the promotion reads its
    first page: no LIST of delayed/ of its own, no GET); with 1,000 delayed keys, which
    fill that page before messages/, one LIST of messages/ too. Regression (issue 16):
    with 10 it cost a LIST of messages/ and one of delayed/."""
    producer = pq.register_producer("p")
    for i in range(n):
        producer.publish(TOPIC, {"n": i}, delay_seconds=3600 + i)
    consumer = pq.register_consumer("c", [TOPIC])
    ops.clear()
    for _ in range(5):
        assert consumer.poll() == []
        clock.advance(1.0)
    cut = n > idle.PAGE
    assert ops == {("list", ""): 5, **({("list", "messages"): 5} if cut else {})}, ops
    result = promotion.promote_due(pq.context, TOPIC)
    assert (result.lists, result.listed, result.promoted) == (
        1, min(n, promotion.FIRST_PAGE), 0)


def test_promotion_reads_no_delayed_body_and_moves_with_a_copy_and_a_delete(
    pq: PawnQueue, clock: FakeClock, ops: Counter[tuple[str, str]]
) -> None:
    producer = pq.register_producer("p")
    for i in range(30):
        producer.publish(TOPIC, {"n": i}, delay_seconds=5)
    clock.advance(5)
    ops.clear()
    assert promotion.promote_due(pq.context, TOPIC).promoted == 30
    # the memory store's hook names a copy by its destination; the lock: a PUT, a DELETE
    assert ops == {("list", "delayed"): 1, ("copy", "messages"): 30,
                   ("delete", "delayed"): 30, ("put", "delayed.lock"): 1,
                   ("delete", "delayed.lock"): 1}, ops


def test_a_consumer_promotes_at_most_once_a_poll_interval_per_topic(
    pq: PawnQueue, clock: FakeClock, ops: Counter[tuple[str, str]]
) -> None:
    producer = pq.register_producer("p")
    producer.publish_batch(TOPIC, [{"n": n} for n in range(20)])
    consumer = pq.register_consumer("c", [TOPIC])
    ops.clear()
    for _ in range(10):
        assert len(consumer.poll(max_messages=1)) == 1  # busy: found messages each time
        clock.advance(0.25)  # 2.5 s in all: passes at 0, 1 and 2 s
    # the first poll (idle: none before it) read the idle LIST's page of delayed/; the
    # busy ones list delayed/ at 1 and 2 s
    assert (ops[("list", "")], ops[("list", "delayed")]) == (1, 2), ops


def test_due_messages_behind_many_not_due_ones_are_reached(
    pq: PawnQueue, clock: FakeClock
) -> None:
    """Keys order by created_at + delay: messages published with an old created_at
    and a long delay sort first yet are not due. More of them than a pass lists
    must not hide a due message behind them: passes go on from where the last
    stopped."""
    producer = pq.register_producer("p")
    old = START - timedelta(days=3)
    blockers = promotion.MAX_LISTED_PER_PASS + 50
    for i in range(blockers):
        producer.publish(TOPIC, {"blocker": i}, created_at=old + timedelta(microseconds=i),
                         delay_seconds=86400)
    due = producer.publish(TOPIC, {"due": True}, delay_seconds=2)
    clock.advance(2)
    consumer = pq.register_consumer("c", [TOPIC])
    got: list[str] = []
    for _ in range(3):
        got += [m.id for m in consumer.poll()]
        clock.advance(1.0)
    assert got == [due]
    assert len(keys(pq, "delayed")) == blockers


def test_a_foreign_object_under_delayed_is_left_alone(pq: PawnQueue, clock: FakeClock) -> None:
    pq.store.put(f"{TOPIC}/delayed/not-a-delayed-name.json", b"{}")
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=1)
    clock.advance(1)
    assert promotion.promote_due(pq.context, TOPIC).promoted == 1
    assert keys(pq, "delayed") == [f"{TOPIC}/delayed/not-a-delayed-name.json"]
    assert [layout.parse_message_key(TOPIC, k) for k in keys(pq, "messages")] == [mid]


def test_keys_are_deterministic_for_one_message_so_a_republish_overwrites(
    pq: PawnQueue,
) -> None:
    producer = pq.register_producer("p")
    mid = "0b5f6a52-6c1e-4f8e-9c1f-0a5d2b7c9e11"
    for _ in range(3):
        producer.publish(TOPIC, {"n": 1}, message_id=mid, created_at=START, delay_seconds=60)
    [key] = keys(pq, "delayed")
    assert layout.parse_delayed_key(TOPIC, key) == layout.DelayedName(
        layout.sortable_timestamp(START + timedelta(seconds=60)), mid, 60000)


def test_count_delayed(pq: PawnQueue) -> None:
    producer = pq.register_producer("p")
    for i in range(7):
        producer.publish(TOPIC, {"n": i}, delay_seconds=60)
    assert delayed.count_delayed(pq.context, TOPIC) == (7, True)
    assert delayed.count_delayed(pq.context, TOPIC, limit=5) == (5, False)


def test_one_promoter_at_a_time_per_topic_and_a_dead_ones_lock_goes_stale(
    pq: PawnQueue, clock: FakeClock
) -> None:
    """Two promoters at once could write a message again after its first copy was
    consumed (the second listed it before the first deleted it): the topic's lock
    lets one move at a time. A lock whose holder died is taken over once stale."""
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=1)
    clock.advance(1)
    held = promotion.PromotionLock.take(pq.context, TOPIC, pq.store.server_time())
    assert held is not None and held.token
    blocked = promotion.promote_due(pq.context, TOPIC)
    assert blocked.locked_out and blocked.promoted == 0 and keys(pq, "messages") == []
    clock.advance(pq.context.visibility)  # not stale yet (a grace beyond the timeout)
    assert promotion.promote_due(pq.context, TOPIC).locked_out
    clock.advance(5)  # its holder never came back
    assert promotion.promote_due(pq.context, TOPIC).promoted == 1
    assert [layout.parse_message_key(TOPIC, k) for k in keys(pq, "messages")] == [mid]
    assert pq.store.list(layout.delayed_lock_key(TOPIC)).objects == []
    assert not held.fresh()


def test_a_foreign_key_shaped_like_a_delayed_one_with_no_such_date_breaks_no_poll(
    pq: PawnQueue, clock: FakeClock
) -> None:
    """A key that matches the delayed name's pattern but is no date (month 13) is a
    foreign object: left alone, and the polls that list it go on."""
    odd = f"{TOPIC}/delayed/20261399T000000_000000-0b5f6a52-6c1e-4f8e-9c1f-0a5d2b7c9e11-d5.json"
    pq.store.put(odd, b"{}")
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=1)
    clock.advance(1)
    consumer = pq.register_consumer("c", [TOPIC])
    assert [m.id for m in consumer.poll()] == [mid]
    assert keys(pq, "delayed") == [odd]


def test_a_failed_promotion_pass_breaks_no_poll_and_warns_when_it_persists(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    failing = {"on": True}

    def hook(op: str, key: str) -> None:
        if failing["on"] and op == "list" and key.startswith(f"{TOPIC}/delayed/"):
            raise StorageError("injected: no listing")

    with memory_queue({"polling": {"interval_seconds": 1.0}}, topics=[TOPIC], clock=clock,
                      hooks=hook) as pq:
        producer = pq.register_producer("p")
        later = producer.publish(TOPIC, {"n": 1}, delay_seconds=1)
        first = producer.publish(TOPIC, {"n": 2})
        second = producer.publish(TOPIC, {"n": 3})
        consumer = pq.register_consumer("c", [TOPIC])
        with caplog.at_level(logging.INFO, logger="pawn_queue_sync.queue.promotion"):
            # the first poll is idle: its one LIST of the topic serves the promotion
            assert [m.id for m in consumer.poll(max_messages=1)] == [first]
            clock.advance(1)
            # busy: the pass lists delayed/ and fails; the poll is still served
            assert [m.id for m in consumer.poll(max_messages=1)] == [second]
            clock.advance(1)
            assert consumer.poll() == []
        levels = [r.levelno for r in caplog.records if "delayed messages" in r.getMessage()]
        assert levels == [logging.INFO, logging.WARNING]
        failing["on"] = False
        clock.advance(1)
        assert [m.id for m in consumer.poll()] == [later]
