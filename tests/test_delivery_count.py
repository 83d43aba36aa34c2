"""Deliveries abandoned by a dead handler process count, and end in the dead letter.

A handler that kills its process (segfault, OOM kill, ``os._exit``) never reaches
``retry``; before, only ``retry`` counted, so such a message was delivered forever. Now
the poll that reaps the stale lease of an abandoned delivery records it on the message
(``attempts`` + 1, ``last_error``), and a claim of a message delivered
``polling.max_delivery_count`` times without an ack dead-letters it instead of handing
it out. A "crash" here is a consumer dropped without settling what it polled.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, StorageError, layout
from pawn_queue_sync.storage.memory import MemoryStore
from tests.servers import deep_merge
from tests.test_consumer_regressions import (
    DEADLINE,
    STRATEGIES,
    TOPIC,
    JumpClock,
    memory_queue,
    objects,
    one_claimed,
)

VISIBILITY = 3
#: past the visibility timeout and its grace by the server's clock: stale for certain
STALE = VISIBILITY + 2.5


def dead_letters(pq: PawnQueue) -> list[dict[str, Any]]:
    return [json.loads(pq.store.get(key).body)
            for key in objects(pq, layout.dead_letter_prefix(TOPIC))]


def poll_until_delivered(pq: PawnQueue, name: str) -> list[Any]:
    """A fresh consumer polls until its poll returns something, or until the message
    is gone from ``messages/`` (dead-lettered at claim); returns what it got."""
    consumer = pq.register_consumer(name, [TOPIC])
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        got = consumer.poll()
        if got or not objects(pq, layout.messages_prefix(TOPIC)):
            return got
        threading.Event().wait(0.2)  # the lease goes stale by the server's clock
    raise AssertionError("nothing delivered before the deadline")


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_crashed_deliveries_count_and_the_next_claim_dead_letters(strategy: str) -> None:
    """Before: every fresh consumer got delivery_count 1 and the message forever."""
    clock = JumpClock()
    pq = memory_queue(strategy, clock=clock, visibility_timeout_seconds=VISIBILITY,
                      lease_refresh_interval_seconds=1, max_delivery_count=3)
    mid = pq.register_producer("p").publish(TOPIC, {"kills": "its process"})
    counts = []
    for i in range(3):
        (msg,) = pq.register_consumer(f"c{i}", [TOPIC]).poll()
        counts.append(msg.delivery_count)
        clock.jump(STALE)  # the consumer "died" holding it
    assert counts == [1, 2, 3]
    assert pq.register_consumer("c3", [TOPIC]).poll() == []
    assert objects(pq, layout.messages_prefix(TOPIC)) == []
    assert objects(pq, layout.leases_prefix(TOPIC)) == []
    (dl,) = dead_letters(pq)
    assert dl["id"] == mid and dl["payload"] == {"kills": "its process"}
    assert dl["dead_letter"]["delivery_count"] == 3
    assert "delivered 3 times without an ack" in dl["dead_letter"]["reason"]
    assert "process may have died" in dl["dead_letter"]["reason"]
    pq.teardown()


def test_failed_handler_calls_and_crashes_count_together() -> None:
    """delivery_count counts failed handler calls (retry) and abandoned deliveries."""
    clock = JumpClock()
    pq = memory_queue(clock=clock, visibility_timeout_seconds=VISIBILITY,
                      lease_refresh_interval_seconds=1, max_delivery_count=3)
    pq.register_producer("p").publish(TOPIC, 1)
    consumer = pq.register_consumer("c", [TOPIC])
    (msg,) = consumer.poll()
    assert msg.delivery_count == 1
    consumer.retry(msg, "ValueError: first")
    (msg,) = consumer.poll()
    assert msg.delivery_count == 2 and msg.body["last_error"] == "ValueError: first"
    clock.jump(STALE)  # this one dies
    (msg,) = pq.register_consumer("c2", [TOPIC]).poll()
    assert msg.delivery_count == 3
    assert "abandoned" in msg.body["last_error"]
    msg.ack()
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    assert dead_letters(pq) == []
    pq.teardown()


def test_an_abandoned_delivery_is_counted_once_when_its_reap_fails() -> None:
    """A poll that recorded the abandoned delivery but could not delete the lease
    leaves it to the next poll, which must not count that delivery again."""
    clock = JumpClock()
    fail = threading.Event()

    def hooks(op: str, key: str) -> None:
        if fail.is_set() and op == "delete" and key.endswith(".lease"):
            fail.clear()
            raise StorageError("injected", key=key)

    pq = memory_queue(store=MemoryStore(clock, hooks=hooks), clock=clock,
                      visibility_timeout_seconds=VISIBILITY,
                      lease_refresh_interval_seconds=1, max_delivery_count=5)
    pq.register_producer("p").publish(TOPIC, 1)
    (first,) = pq.register_consumer("c0", [TOPIC]).poll()
    clock.jump(STALE)
    fail.set()
    assert pq.register_consumer("c1", [TOPIC]).poll() == []  # recorded, lease kept
    (msg,) = pq.register_consumer("c2", [TOPIC]).poll()
    assert (first.delivery_count, msg.delivery_count) == (1, 2)
    pq.teardown()


def test_a_refreshed_lease_is_neither_reaped_nor_counted() -> None:
    clock, pq, _holder, msg = one_claimed(VISIBILITY, "c0")
    clock.jump(2)
    msg.refresh()
    clock.jump(2.5)  # 4.5 s after the claim, 2.5 s after the refresh: live
    assert pq.register_consumer("c1", [TOPIC]).poll() == []
    msg.ack()
    assert msg.state == "acked"
    pq.teardown()


def test_the_lease_names_its_message_key_and_pawn_queue_reads_it() -> None:
    """The reaper finds the message by the key written in the lease; pawn-queue
    0.1.3's LeaseContent.from_dict ignores fields it does not know."""
    pq = memory_queue()
    pq.register_producer("p").publish(TOPIC, 1)
    (msg,) = pq.register_consumer("c", [TOPIC]).poll()
    doc = json.loads(pq.store.get(msg.lease_key).body)
    assert doc["message_key"] == msg.key
    assert {"consumer_id", "message_id", "claimed_at", "expires_at", "nonce"} <= set(doc)
    msg.refresh()
    assert json.loads(pq.store.get(msg.lease_key).body)["message_key"] == msg.key
    pq.teardown()


@pytest.mark.parametrize("strategy", ["conditional_write", "csprng_batch"])
def test_crashed_deliveries_dead_letter_on_seaweedfs(
    strategy: str, real_s3_config: dict[str, Any]
) -> None:
    """Fresh consumers claim and drop the message max_delivery_count times; each
    lease goes stale by SeaweedFS's clock; the next claim dead-letters it."""
    cfg = deep_merge(real_s3_config, STRATEGIES[strategy])
    if strategy != "conditional_write":  # SeaweedFS under load: see test_lease_seaweedfs
        cfg = deep_merge(cfg, {"concurrency": {"csprng_verify": {
            "jitter_min_ms": 250, "jitter_max_ms": 300}}})
    cfg = deep_merge(cfg, {"polling": {"visibility_timeout_seconds": VISIBILITY,
                                       "lease_refresh_interval_seconds": 1,
                                       "max_delivery_count": 2}})
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic(TOPIC)
        mid = pq.register_producer("p").publish(TOPIC, "poison")
        counts = []
        for i in range(2):
            (msg,) = poll_until_delivered(pq, f"c{i}")
            counts.append(msg.delivery_count)  # then "crash": never settled
        assert counts == [1, 2]
        assert poll_until_delivered(pq, "c2") == []
        assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
        (dl,) = dead_letters(pq)
        assert dl["id"] == mid and dl["payload"] == "poison"
        assert dl["dead_letter"]["delivery_count"] == 2
        assert "delivered 2 times without an ack" in dl["dead_letter"]["reason"]


def test_a_holder_refreshing_after_the_count_was_recorded_still_acks() -> None:
    """A janitor records the delivery as abandoned (a new ETag on the message), then
    the holder refreshes before the janitor's conditional DELETE: the lease stays,
    and the holder's ack, finding the ETag changed, sees the same message and deletes
    it (it is not mistaken for a re-published one and delivered again)."""
    clock = JumpClock()
    held: list[Any] = []

    def hooks(op: str, key: str) -> None:
        if op == "delete" and key.endswith(".lease") and held and held[0].state == "leased":
            held.pop().refresh()  # lands between the janitor's record and its DELETE

    pq = memory_queue(store=MemoryStore(clock, hooks=hooks), clock=clock,
                      visibility_timeout_seconds=VISIBILITY,
                      lease_refresh_interval_seconds=1)
    pq.register_producer("p").publish(TOPIC, 1)
    (msg,) = pq.register_consumer("c0", [TOPIC]).poll()
    clock.jump(STALE)
    held.append(msg)
    assert pq.register_consumer("c1", [TOPIC]).poll() == []  # counted, not reaped
    assert json.loads(pq.store.get(msg.key).body)["attempts"] == 1
    msg.ack()
    assert msg.state == "acked"
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()
