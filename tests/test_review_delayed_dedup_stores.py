"""Review 16B (R1) findings on SeaweedFS and the local store (their MemoryStore twins
under a manual clock: tests/test_review_delayed_dedup.py): delete_topic racing each
move between a topic's sections, a delayed retry whose lease is lost during its write,
a deduplicated publish completed with another delay, markers expired by short-lived
producers, and the promotion lock judged by its holder's lifetime. Each test counts
the objects a message is stored as (none lost, none twice)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from pawn_queue_sync import LeaseLostError, PawnQueue, PublishError, layout
from pawn_queue_sync.errors import DeadlineExceeded, TopicNotEmptyError
from pawn_queue_sync.queue import promotion
from tests.servers import deep_merge
from tests.test_deadletters import config  # noqa: F401  (the fixture: seaweedfs, local)
from tests.test_review_delayed_dedup import lose_first_answer

TOPIC = "racing"
#: Seconds a test waits for the server's clock or a rival before failing.
DEADLINE = 60.0


def keys(pq: PawnQueue, section: str) -> list[str]:
    return [o.key for o in pq.store.list(f"{TOPIC}/{section}/").objects]


def stored_as(pq: PawnQueue, mid: str) -> list[str]:
    """Every key of the topic naming message ``mid`` (messages, delayed, dead letters;
    a packed message's segment is not named by it)."""
    return [k for s in ("messages", "delayed", "dead-letter") for k in keys(pq, s) if mid in k]


def on_first_list(pq: PawnQueue, prefix: str, action: Callable[[], object]) -> None:
    """Run ``action`` once, just before the first LIST of ``prefix`` from now on (the
    store's method patched on the instance: any store)."""
    store = pq.store
    inner = store.list
    fired: list[bool] = []

    def listing(p: str, *args: Any, **kwargs: Any) -> Any:
        if p == prefix and not fired:
            fired.append(True)
            action()
        return inner(p, *args, **kwargs)

    store.list = listing  # type: ignore[method-assign]


def until_server_time(pq: PawnQueue, when: datetime) -> None:
    """Wait (polling the server's clock) until the server's time is past ``when``."""
    end = time.monotonic() + DEADLINE
    while (now := pq.store.server_time()) is None or now <= when:
        assert time.monotonic() < end, f"the server's clock never passed {when}"
        time.sleep(0.2)


# -- 1. delete_topic racing a move -------------------------------------------------------------

#: mover -> (packed topic, the section whose first check LIST the move runs before: a
#: moment the old check order, or the order first proposed, missed it)
MOVES = {
    "promotion": (False, layout.DELAYED),
    "redrive": (False, layout.DEAD_LETTER),
    "nack": (False, layout.DELAYED),
    "retry-delay": (False, layout.MESSAGES),
    "packed-retry-delay": (True, layout.SEGMENTS),
}


@pytest.mark.parametrize("mover", list(MOVES))
def test_delete_topic_refuses_a_topic_whose_message_moves_during_its_check(
    config: dict[str, Any], mover: str  # noqa: F811
) -> None:
    packed, section = MOVES[mover]
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        consumer = pq.register_consumer("c", [TOPIC])
        move: Callable[[], object]
        if mover == "promotion":
            mid = producer.publish(TOPIC, {"n": 1}, delay_seconds=1)
            [written] = [o.last_modified for o in pq.store.list(f"{TOPIC}/delayed/").objects]
            assert written is not None
            until_server_time(pq, written + timedelta(seconds=2))

            def move() -> object:
                return promotion.promote_due(pq.context, TOPIC).promoted
        else:
            [mid] = producer.publish_batch(TOPIC, [{"n": 1}])
            [msg] = consumer.poll()
            if mover == "redrive":
                msg.nack("bad")

                def move() -> object:
                    return pq.redrive(TOPIC)
            elif mover == "nack":
                def move() -> object:
                    return msg.nack("bad")
            else:
                def move() -> object:
                    return msg.retry(delay_seconds=3600)
        on_first_list(pq, f"{TOPIC}/{section}/", move)
        with pytest.raises(TopicNotEmptyError):
            pq.delete_topic(TOPIC)
        left = stored_as(pq, mid)
        assert len(left) == 1, left  # moved once, kept, in one place
        assert pq.store.list(layout.topic_marker_key(TOPIC)).objects  # the topic stays


# -- 2. a delayed retry whose lease is lost while its copy is written ----------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_a_delayed_retry_that_loses_its_lease_during_its_write_leaves_no_copy(
    config: dict[str, Any], packed: bool  # noqa: F811
) -> None:
    """The delayed copy's PUT lands, slowly: meanwhile the lease went stale (by the
    server's clock) and consumer b took the message. The retry fails and removes its
    copy: the message is b's, stored once (before the fix the copy stayed, and came
    back after b acked it)."""
    cfg = deep_merge(config, {"polling": {"visibility_timeout_seconds": 4.0,
                                          "lease_refresh_interval_seconds": 1.0}})
    with PawnQueue(cfg) as pq:
        pq.create_topic(TOPIC, packed=packed)
        [mid] = pq.register_producer("p").publish_batch(TOPIC, [{"n": 1}])
        a = pq.register_consumer("a", [TOPIC])
        b = pq.register_consumer("b", [TOPIC])
        [msg] = a.poll()
        store = pq.store
        inner_put = store.put
        taken: list[Any] = []

        def slow_put(key: str, body: bytes, **kwargs: Any) -> Any:
            result = inner_put(key, body, **kwargs)
            if key.startswith(layout.delayed_prefix(TOPIC)) and not taken:
                end = time.monotonic() + DEADLINE
                while not taken:  # the lease goes stale by the server's clock: b takes it
                    assert time.monotonic() < end, "b never took the stale message"
                    taken.extend(b.poll())
                    time.sleep(0.2)
            return result

        store.put = slow_put  # type: ignore[method-assign]
        with pytest.raises((LeaseLostError, DeadlineExceeded)):
            msg.retry(delay_seconds=3600, error="boom")
        store.put = inner_put  # type: ignore[method-assign]
        assert [m.id for m in taken] == [mid]
        assert keys(pq, "delayed") == [], "the lost retry's delayed copy was left"
        taken[0].ack()
        assert stored_as(pq, mid) == []


# -- 3. a deduplicated publish completed with another delay ----------------------------------


@pytest.mark.parametrize("second_delay", [2.0, None], ids=["other-delay", "no-delay"])
def test_a_dedup_completion_with_another_delay_stores_one_message(
    config: dict[str, Any], second_delay: float | None  # noqa: F811
) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC)
        failed = lose_first_answer(pq, TOPIC)
        producer = pq.register_producer("p")
        with pytest.raises(PublishError):
            producer.publish(TOPIC, {"n": 1}, dedup_id="k", delay_seconds=5)
        mid = producer.publish(TOPIC, {"n": 1}, dedup_id="k", delay_seconds=second_delay)
        assert stored_as(pq, mid) == failed  # the first writer's key, once


# -- 4. markers expired by short-lived producers -------------------------------------------


def test_a_short_lived_producer_expires_old_markers_at_its_first_dedup_publish(
    config: dict[str, Any],  # noqa: F811
) -> None:
    with PawnQueue(deep_merge(config, {"publishing": {"dedup_window_seconds": 1}})) as pq:
        pq.create_topic(TOPIC)
        pq.register_producer("job1").publish(TOPIC, {"n": 1}, dedup_id="old")
        [old] = pq.store.list(f"{TOPIC}/dedup/").objects
        assert old.last_modified is not None
        until_server_time(pq, old.last_modified + timedelta(seconds=3))
        pq.register_producer("job2").publish(TOPIC, {"n": 2}, dedup_id="new")
        left = keys(pq, "dedup")
        assert old.key not in left and len(left) == 1, left


# -- 5. the promotion lock judged by its holder's lifetime ---------------------------------


def test_a_promotion_lock_outlives_a_shorter_visibility_of_its_reader(
    config: dict[str, Any],  # noqa: F811
) -> None:
    long_cfg = deep_merge(config, {"polling": {"visibility_timeout_seconds": 300.0}})
    short_cfg = deep_merge(config, {"polling": {"visibility_timeout_seconds": 3.0,
                                                "lease_refresh_interval_seconds": 1.0}})
    with PawnQueue(long_cfg) as holder, PawnQueue(short_cfg) as reader:
        holder.create_topic(TOPIC)
        lock = promotion.PromotionLock.take(holder.context, TOPIC, holder.store.server_time())
        assert lock is not None
        [info] = holder.store.list(layout.delayed_lock_key(TOPIC)).objects
        assert info.last_modified is not None
        until_server_time(holder, info.last_modified + timedelta(seconds=5))
        now = reader.store.server_time()
        assert promotion.PromotionLock.take(reader.context, TOPIC, now) is None
        lock.release()
        assert promotion.PromotionLock.take(reader.context, TOPIC, now) is not None
