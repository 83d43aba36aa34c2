"""Re-review 16B RR1 (of 7e4466c and b35a31d), findings 2 and 3: delete_topic's check
against a message that moves twice during it (retry with a delay, then its
promotion); a promotion lock or dedup marker whose body is foreign (a lifetime or
delay no float holds, nesting past the recursion limit); a promotion failing with an
error that is no StorageError, which must not strand another topic's claims.
MemoryStore under a manual FakeClock."""

from __future__ import annotations

from typing import Any

import pytest

from pawn_queue_sync import layout
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.errors import TopicNotEmptyError
from pawn_queue_sync.queue import dedup, promotion
from pawn_queue_sync.queue.core import PawnQueue
from tests.test_review_delayed_dedup import (  # noqa: F401 - fixtures
    TOPIC,
    Hooks,
    clock,
    hooks,
    keys,
    pq,
)


@pytest.mark.parametrize("claimed", ["before", "during"])
def test_delete_topic_never_orphans_a_message_moved_twice_meanwhile(
    pq: PawnQueue, clock: FakeClock, hooks: Hooks, claimed: str  # noqa: F811
) -> None:
    """A leased message is retried with a short delay after delete_topic's first
    delayed/ LIST (and before its messages/ LIST), then promoted before its second
    delayed/ LIST: messages -> delayed -> messages. Every LIST finds its section
    empty, the retry dropped the lease, so the topic is deleted and the message left
    orphaned in messages/. ``claimed``: the lease taken before delete_topic starts
    (its lease LISTs see it), or during its check, just after those (only the
    messages/ LIST after the second delayed/ one sees it)."""
    mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
    consumer = pq.register_consumer("c", [TOPIC])
    held: list[Any] = [] if claimed == "during" else consumer.poll()
    step: list[str] = []

    def between(op: str, key: str) -> None:
        if op != "list" or len(step) >= 2:
            return
        if not held:
            if key.startswith(f"{TOPIC}/dead-letter"):  # a claim after the lease LISTs
                hooks.fn = None
                held.extend(consumer.poll())
                hooks.fn = between
            return
        (msg,) = held
        if key == layout.messages_prefix(TOPIC) and not step:
            step.append("retried")
            msg.retry(delay_seconds=0.001)  # messages -> delayed
        elif key == layout.delayed_prefix(TOPIC) and step == ["retried"]:
            step.append("promoting")
            clock.advance(1)  # due
            assert promotion.promote_due(pq.context, TOPIC).promoted == 1  # -> messages

    hooks.fn = between
    try:
        pq.delete_topic(TOPIC)
        deleted = True
    except TopicNotEmptyError:
        deleted = False
    hooks.fn = None
    assert step == ["retried", "promoting"]
    left = keys(pq, "messages") + keys(pq, "delayed")
    assert not deleted or left == [], f"topic deleted, message {mid} orphaned at {left}"


@pytest.mark.parametrize("body", [
    b'{"at": "2026-03-01T12:00:00+00:00", "lifetime_seconds": 1' + b"0" * 400 + b"}",
    b"[" * 100000,
], ids=["int-too-large-for-float", "deeply-nested"])
def test_a_foreign_promotion_lock_body_does_not_break_every_poll(
    pq: PawnQueue, clock: FakeClock, body: bytes  # noqa: F811
) -> None:
    """A lock object whose body is not one of ours (a JSON integer with 401 digits
    as its lifetime; a deeply nested array) is judged by the reader's visibility, as
    documented for unreadable bodies, and taken over once stale: the poll must not
    raise, and the due delayed message must eventually be delivered."""
    producer = pq.register_producer("p")
    mid = producer.publish(TOPIC, {"n": 1}, delay_seconds=1)
    pq.store.put(layout.delayed_lock_key(TOPIC), body)
    consumer = pq.register_consumer("c", [TOPIC])
    got: list[str] = []
    errors: list[str] = []
    for _ in range(20):
        clock.advance(pq.context.visibility / 5 + 1)
        try:
            for msg in consumer.poll():
                got.append(msg.id)
                msg.ack()
        except Exception as exc:  # what the caller of poll() sees
            errors.append(f"{type(exc).__name__}: {str(exc)[:80]}")
        if got:
            break
    assert not errors, f"poll raised {len(errors)} times, first: {errors[0]}"
    assert got == [mid]


def test_a_foreign_promotion_lock_on_one_topic_does_not_stop_another_topics_delivery(
    pq: PawnQueue, clock: FakeClock  # noqa: F811
) -> None:
    """A consumer of two topics: the bad lock on ``jobs`` (with a due delayed message
    there) must not keep ``other``'s plain messages from being handed out; claims made
    on ``other`` in a poll that then raises are not returned to the caller (they come
    back only after the visibility timeout)."""
    pq.create_topic("other")
    producer = pq.register_producer("p")
    producer.publish(TOPIC, {"n": 1}, delay_seconds=1)
    plain = set(producer.publish_batch("other", [{"n": i} for i in range(4)]))
    pq.store.put(layout.delayed_lock_key(TOPIC), b'{"lifetime_seconds": 1' + b"0" * 400 + b"}")
    consumer = pq.register_consumer("c", [TOPIC, "other"])
    clock.advance(2)
    got: set[str] = set()
    errors = 0
    for _ in range(4):
        try:
            got.update(m.id for m in consumer.poll(max_messages=10))
        except OverflowError:
            errors += 1
    assert got == plain, f"{len(got)} of 4 plain messages of 'other' handed out; " \
                         f"{errors} of 4 polls raised OverflowError"


def test_a_promotion_failing_with_any_error_keeps_the_polls_claims_on_other_topics(
    pq: PawnQueue, clock: FakeClock, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """Whatever a promotion pass raises (here the lock's take raises RuntimeError, as
    a bug or a foreign object could make it) only logs: the poll returns what it
    claimed of the other topic, none stranded behind a raised error."""
    pq.create_topic("other")
    producer = pq.register_producer("p")
    producer.publish(TOPIC, {"n": 1}, delay_seconds=1)
    plain = set(producer.publish_batch("other", [{"n": i} for i in range(4)]))

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected: not a storage error")

    monkeypatch.setattr(promotion.PromotionLock, "take", broken)
    consumer = pq.register_consumer("c", [TOPIC, "other"])
    clock.advance(2)
    got: set[str] = set()
    for _ in range(4):
        got.update(m.id for m in consumer.poll(max_messages=10))
        clock.advance(pq.context.config.polling.interval_seconds)
    assert got == plain


@pytest.mark.parametrize("body", [
    b"[" * 100000,
    b'{"dedup_id": "d1", "message_id": "m", "created_at": "2026-03-01T12:00:00+00:00", '
    b'"state": "written", "nonce": "n", "delay_seconds": 1' + b"0" * 400 + b"}",
], ids=["deeply-nested", "delay-too-large-for-float"])
def test_a_foreign_dedup_marker_is_replaced_not_raised(
    pq: PawnQueue, body: bytes  # noqa: F811
) -> None:
    """A body at a dedup marker's key that is not one of ours, of any shape, is a
    foreign object (replaced, as documented): publish(dedup_id=) publishes once and
    raises nothing (it raised RecursionError / OverflowError)."""
    pq.store.put(dedup.marker_key(TOPIC, "d1"), body)
    producer = pq.register_producer("p")
    first = producer.publish(TOPIC, {"n": 1}, dedup_id="d1")
    assert producer.publish(TOPIC, {"n": 1}, dedup_id="d1") == first
    consumer = pq.register_consumer("c", [TOPIC])
    assert [m.id for m in consumer.poll(max_messages=10)] == [first]
