"""Reviewer R1 (issue 16 part 2): attacks on delayed messages and dedup, on a
MemoryStore under a manual FakeClock. Each test asserts what a user expects; a
failure is a finding (see /work/helpers/review16B_r1.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from pawn_queue_sync import LeaseLostError, PublishError, StorageError, layout
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.config import load_config
from pawn_queue_sync.errors import DeadlineExceeded, TopicNotEmptyError
from pawn_queue_sync.queue import promotion
from pawn_queue_sync.queue.core import PawnQueue
from pawn_queue_sync.testing import memory_queue

TOPIC = "jobs"
START = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


class Hooks:
    """A settable store hook: ``fn(op, key)`` or nothing."""

    def __init__(self) -> None:
        self.fn: Any = None

    def __call__(self, op: str, key: str) -> None:
        if self.fn is not None:
            self.fn(op, key)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def hooks() -> Hooks:
    return Hooks()


def _queue(clock: FakeClock, hooks: Hooks, packed: bool = False) -> PawnQueue:
    pq = memory_queue({"polling": {"interval_seconds": 1.0}}, clock=clock, hooks=hooks)
    pq.create_topic(TOPIC, packed=packed)
    return pq


@pytest.fixture
def pq(clock: FakeClock, hooks: Hooks) -> Iterator[PawnQueue]:
    with _queue(clock, hooks) as queue:
        yield queue


def keys(pq: PawnQueue, section: str) -> list[str]:
    return [o.key for o in pq.store.list(f"{TOPIC}/{section}/").objects]


def drain(pq: PawnQueue, clock: FakeClock, name: str = "drainer", rounds: int = 20
          ) -> Counter[str]:
    """Deliveries by id while time runs on (promotion included), each acked."""
    consumer = pq.register_consumer(name, [TOPIC])
    seen: Counter[str] = Counter()
    for _ in range(rounds):
        clock.advance(2)
        for msg in consumer.poll(max_messages=10):
            seen[msg.id] += 1
            msg.ack()
    return seen


def delete_topic(pq: PawnQueue) -> bool:
    """Whether ``delete_topic`` (no force) deleted the topic (False: it refused)."""
    try:
        pq.delete_topic(TOPIC)
    except TopicNotEmptyError:
        return False
    return True


def lose_first_answer(pq: PawnQueue, topic: str = TOPIC) -> list[str]:
    """Make the store's first PUT of a delayed key of ``topic`` land, then raise
    StorageError (an answer lost); the keys it did that to (filled as it happens)."""
    store = pq.store
    inner_put = store.put
    failed: list[str] = []

    def put(key: str, body: bytes, **kwargs: Any) -> Any:
        result = inner_put(key, body, **kwargs)
        if key.startswith(layout.delayed_prefix(topic)) and not failed:
            failed.append(key)
            raise StorageError("injected: the answer was lost", key=key)
        return result

    store.put = put  # type: ignore[method-assign]
    return failed


# -- 1. delete_topic racing a promotion ---------------------------------------------------


def test_delete_topic_never_orphans_a_message_a_promotion_moves_meanwhile(
    pq: PawnQueue, clock: FakeClock, hooks: Hooks
) -> None:
    """delete_topic (no force) checks messages/ then delayed/: a promoter that copies
    a due message to messages/ and deletes its delayed object between those two LISTs
    makes both look empty; the topic is deleted and the message orphaned."""
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1}, delay_seconds=1)
    clock.advance(2)
    promoted: list[int] = []
    busy: list[bool] = []

    def between(op: str, key: str) -> None:
        if op == "list" and key == layout.delayed_prefix(TOPIC) and not busy:
            busy.append(True)  # the promoter's own LIST runs through here too
            promoted.append(promotion.promote_due(pq.context, TOPIC).promoted)

    hooks.fn = between
    deleted = delete_topic(pq)
    hooks.fn = None
    left = keys(pq, "messages")
    assert promoted == [1]
    # expected: either refused, or nothing of the topic is left behind
    assert not deleted or left == [], (
        f"topic deleted, its promoted message {mid} orphaned at {left}")


# -- 2. retry(delay) whose lease is lost between the delayed write and the removal ---------


@pytest.mark.parametrize("landed", [False, True], ids=["sent-late", "landed-slowly"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_a_delayed_retry_that_loses_its_lease_leaves_no_second_copy(
    clock: FakeClock, hooks: Hooks, packed: bool, landed: bool
) -> None:
    """The delayed copy's PUT carried no deadline (a plain retry's PUT does: the
    fence): a slow PUT lands after the lease went stale and another consumer took
    the message; the retry then raised LeaseLostError but left the delayed copy, so
    the message taken (and acked) by the other consumer came back after the delay.
    ``sent-late``: the time passes before the PUT is sent (now refused by the fence:
    DeadlineExceeded); ``landed-slowly``: the PUT lands, then the time has passed
    (the lease found lost removes the copy)."""
    with _queue(clock, hooks, packed) as pq:
        producer = pq.register_producer("p")
        [mid] = producer.publish_batch(TOPIC, [{"n": 1}])
        a = pq.register_consumer("a", [TOPIC])
        b = pq.register_consumer("b", [TOPIC])
        [msg] = a.poll()
        seen: Counter[str] = Counter({msg.id: 1})
        taken: list[Any] = []

        def slow_delayed_put(op: str, key: str) -> None:
            if op == "put" and key.startswith(layout.delayed_prefix(TOPIC)) and not taken:
                taken.append(None)
                clock.advance(pq.context.visibility + 10)  # the PUT is slow
                for other in b.poll():  # the lease is stale: b takes the message
                    taken.append(other)

        inner_put = pq.store.put
        if landed:
            def put(key: str, body: bytes, **kwargs: Any) -> Any:
                result = inner_put(key, body, **kwargs)
                slow_delayed_put("put", key)
                return result

            pq.store.put = put  # type: ignore[method-assign]
        else:
            hooks.fn = slow_delayed_put
        # 5 s: shorter than the slow write, so b's poll promotes the copy before the
        # retry finds its lease lost (the copy is removed from messages/ then); a packed
        # b claims that promoted copy in the same poll, which no fix can prevent, so
        # there the delay outlasts the slow write
        delay = pq.context.visibility + 30 if packed and landed else 5
        raised: BaseException | None = None
        try:
            msg.retry(delay_seconds=delay, error="boom")
        except (LeaseLostError, DeadlineExceeded) as exc:
            raised = exc
        hooks.fn = None
        pq.store.put = inner_put  # type: ignore[method-assign]
        assert raised is not None
        for other in taken[1:]:
            seen[other.id] += 1
            other.ack()
        assert len(taken) == 2, "b should have taken the stale message"
        seen.update(drain(pq, clock, rounds=20 + int(delay)))
        # a lost retry may leave a's delivery and b's; no third after b acked it
        assert seen[mid] == 2, (f"delivered {seen[mid]} times (retry raised {raised!r}); "
                                f"the delayed copy written by the lost retry came back "
                                f"after b acked it")


# -- 3. dedup completing a publish with another delay -------------------------------------


@pytest.mark.parametrize("second_delay", [3.0, None], ids=["other-delay", "no-delay"])
def test_dedup_completion_with_another_delay_writes_no_second_message(
    pq: PawnQueue, clock: FakeClock, second_delay: float | None
) -> None:
    """A deduplicated delayed publish whose PUT landed but answered an error marks its
    marker failed; a retry of the publish completes it with the marker's id and
    created_at but its own delay: another delayed key (or a plain key), so the same
    message id is stored twice and delivered twice."""
    lose_first_answer(pq)
    producer = pq.register_producer("p")
    with pytest.raises(PublishError):
        producer.publish(TOPIC, {"n": 1}, dedup_id="k", delay_seconds=5)
    mid = producer.publish(TOPIC, {"n": 1}, dedup_id="k", delay_seconds=second_delay)
    stored = keys(pq, "delayed") + keys(pq, "messages")
    seen = drain(pq, clock)
    assert seen == Counter({mid: 1}), f"stored as {stored}, delivered {dict(seen)}"


# -- 4. redrive racing delete_topic (Part A) -----------------------------------------------


def test_delete_topic_never_orphans_a_message_a_redrive_moves_meanwhile(
    pq: PawnQueue, clock: FakeClock, hooks: Hooks
) -> None:
    """The same check order (messages/, then segments/, then dead-letter/) against a
    redrive (copy to messages/, then delete the dead letter): not in this diff's
    area (Part A), the same root cause."""
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
    [msg] = pq.register_consumer("c", [TOPIC]).poll()
    msg.nack("bad")
    assert keys(pq, "dead-letter")
    busy: list[bool] = []

    def between(op: str, key: str) -> None:
        if op == "list" and key == layout.dead_letter_prefix(TOPIC) and not busy:
            busy.append(True)
            pq.redrive(TOPIC)

    hooks.fn = between
    deleted = delete_topic(pq)
    hooks.fn = None
    left = keys(pq, "messages")
    assert busy
    assert not deleted or left == [], f"topic deleted, redriven {mid} orphaned at {left}"


# -- 5. markers of short-lived processes never expire ----------------------------------------


def test_markers_expire_under_processes_that_each_live_shorter_than_the_window(
    clock: FakeClock, hooks: Hooks
) -> None:
    """Each consumer's first expiry run is due max(window, 60 s) after its first poll:
    consumers that live shorter than that (cron jobs, `pawnq consume --max`, Spark
    tasks, drain()) never ran one, so a topic used only by them kept every marker for
    good (storage grew with every deduplicated publish). Now the producers that add
    markers expire the old ones at their first deduplicated publish: ten short-lived
    jobs, each publishing with dedup ids and consuming for 100 s (window 120 s),
    leave only the markers of the last window, never the older ones."""
    with memory_queue({"polling": {"interval_seconds": 1.0},
                       "publishing": {"dedup_window_seconds": 120}},
                      clock=clock, hooks=hooks) as pq:
        pq.create_topic(TOPIC)
        born: dict[str, datetime] = {}
        for run in range(10):  # ten jobs, 100 s each: 1,000 s in all
            producer = pq.register_producer(f"job{run}")
            for i in range(3):
                producer.publish(TOPIC, {"run": run, "n": i}, dedup_id=f"k{run}-{i}")
            for o in pq.store.list(f"{TOPIC}/dedup/").objects:
                assert o.last_modified is not None
                born.setdefault(o.key, o.last_modified)
            consumer = pq.register_consumer(f"job{run}", [TOPIC])
            for _ in range(20):
                for msg in consumer.poll():
                    msg.ack()
                clock.advance(5)
            consumer.close()
        now = clock.now()
        left = keys(pq, "dedup")
        stale = [k for k in left if (now - born[k]).total_seconds() > 2 * 120 + 100]
        assert len(born) == 30
        assert stale == [], f"{len(stale)} markers older than two windows never expired"
        assert len(left) <= 6, f"{len(left)} markers left (the last window's at most)"


# -- the promotion lock judged by its holder's lifetime --------------------------------------


def test_a_promotion_lock_is_judged_stale_by_its_holders_lifetime(
    clock: FakeClock, hooks: Hooks
) -> None:
    """A consumer configured with a visibility timeout of 10 s took over a live lock
    held by one with 300 s (judged by the reader's own timeout), and two promoters then
    ran at once; the lock's body now states its holder's lifetime."""
    with memory_queue({"polling": {"visibility_timeout_seconds": 300.0}},
                      clock=clock, hooks=hooks) as long_pq:
        long_pq.create_topic(TOPIC)
        short_pq = PawnQueue(load_config({"polling": {"visibility_timeout_seconds": 10.0,
                                                      "lease_refresh_interval_seconds": 3.0}}),
                             store=long_pq.store, clock=clock)
        with short_pq:
            short_pq.setup()
            held = promotion.PromotionLock.take(long_pq.context, TOPIC, clock.now())
            assert held is not None
            clock.advance(60)  # stale by 10 s, live by 300 s
            assert promotion.PromotionLock.take(short_pq.context, TOPIC, clock.now()) is None
            assert held.fresh()
            clock.advance(300)  # stale by the holder's own lifetime too: taken over
            assert promotion.PromotionLock.take(short_pq.context, TOPIC,
                                                clock.now()) is not None
