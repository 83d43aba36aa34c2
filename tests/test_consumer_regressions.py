"""Regressions of the consumer and the lease protocol, one test (or a few) per defect.

Pure logic runs on MemoryStore (fault hooks, subclasses that answer like other servers,
a clock that can jump ahead); what depends on a real server runs on SeaweedFS
(``real_s3_config``). Ordering between threads is done with Events, never sleeps; every
wait has a deadline, so a regression fails instead of hanging.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given, settings

from pawn_queue_sync import (
    ConfigError,
    LeaseLostError,
    Message,
    PawnQueue,
    StorageError,
    layout,
    load_config,
)
from pawn_queue_sync.clock import SystemClock
from pawn_queue_sync.storage.base import PutResult
from pawn_queue_sync.storage.memory import MemoryStore, _Object
from tests.servers import deep_merge
from tests.test_protocol_csprng import FAST
from tests.test_protocol_csprng_batch import check, worlds

TOPIC = "jobs"
#: A wait that runs out fails the test; nothing here waits this long when it passes.
DEADLINE = 30.0
CSPRNG_FAST = {"jitter_min_ms": 20, "jitter_max_ms": 40, "verify_retries": 1,
               "verify_retry_delay_ms": 10}
STRATEGIES = {
    "conditional_write": {"concurrency": {"strategy": "conditional_write"}},
    "csprng_batch": {"concurrency": {"strategy": "csprng_verify",
                                     "csprng_verify": CSPRNG_FAST}},
    "csprng_per_key": {"concurrency": {"strategy": "csprng_verify",
                                       "csprng_verify": {**CSPRNG_FAST,
                                                         "consistent_list": False}}},
}


class JumpClock(SystemClock):
    """The real clock, which a test may move ahead at once (both wall and monotonic),
    so a lease can be made old without waiting while requests still take real time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.offset)

    def monotonic(self) -> float:
        return super().monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds


def memory_queue(strategy: str = "conditional_write", *, store: MemoryStore | None = None,
                 clock: Any = None, topics: tuple[str, ...] = (TOPIC,),
                 **polling: Any) -> PawnQueue:
    cfg = deep_merge(STRATEGIES[strategy], {"polling": {"interval_seconds": 0.1, **polling}})
    clock = clock or SystemClock()
    pq = PawnQueue(load_config(cfg), store=store or MemoryStore(clock), clock=clock).setup()
    for topic in topics:
        pq.create_topic(topic)
    return pq


def objects(pq: PawnQueue, prefix: str) -> list[str]:
    return [o.key for o in pq.store.list(prefix).objects]


def one_claimed(
    visibility_timeout_seconds: float, name: str = "c"
) -> tuple[JumpClock, PawnQueue, Any, Message]:
    """A memory queue on a :class:`JumpClock` (refresh interval 1 s) with one message
    published and claimed by consumer *name*: (clock, queue, consumer, message)."""
    clock = JumpClock()
    pq = memory_queue(clock=clock, visibility_timeout_seconds=visibility_timeout_seconds,
                      lease_refresh_interval_seconds=1)
    pq.register_producer("p").publish(TOPIC, 1)
    consumer = pq.register_consumer(name, [TOPIC])
    (msg,) = consumer.poll()
    return clock, pq, consumer, msg


def consume_all(pq: PawnQueue, consumer: Any, polls: int = 40) -> list[Any]:
    """Poll and ack until the topic has no message left (at most ``polls`` polls);
    returns the payloads delivered, in order."""
    seen: list[Any] = []
    for _ in range(polls):
        if not objects(pq, layout.messages_prefix(TOPIC)):
            break
        batch = consumer.poll()
        seen.extend(m.payload for m in batch)
        consumer.ack_many(batch)
    return seen


# -- 1. two message objects with one id ------------------------------------------------------


def publish_twice_with_one_id(pq: PawnQueue) -> None:
    producer = pq.register_producer("p")
    mid = str(uuid.uuid4())
    producer.publish(TOPIC, {"object": "A"}, message_id=mid)  # no created_at: a new key
    producer.publish(TOPIC, {"object": "B"}, message_id=mid)
    assert len(objects(pq, layout.messages_prefix(TOPIC))) == 2


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_objects_with_one_id_each_delivered_once_memory(strategy: str) -> None:
    """Before: a csprng batch claimed both objects under one lease key and built two
    Messages with B's body (one of them keyed A): B was handled twice, A never, and
    acking deleted A unseen."""
    pq = memory_queue(strategy)
    publish_twice_with_one_id(pq)
    seen = consume_all(pq, pq.register_consumer("c", [TOPIC]))
    assert sorted(p["object"] for p in seen) == ["A", "B"]
    assert objects(pq, f"{TOPIC}/messages/") == []
    assert objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


@pytest.mark.parametrize("strategy", ["conditional_write", "csprng_batch"])
def test_two_objects_with_one_id_each_delivered_once_seaweedfs(
    strategy: str, real_s3_config: dict[str, Any]
) -> None:
    cfg = deep_merge(real_s3_config, STRATEGIES[strategy])
    if strategy != "conditional_write":  # SeaweedFS under load: see test_lease_seaweedfs
        cfg = deep_merge(cfg, {"concurrency": {"csprng_verify": {
            "jitter_min_ms": 250, "jitter_max_ms": 300}}})
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic(TOPIC)
        publish_twice_with_one_id(pq)
        seen = consume_all(pq, pq.register_consumer("c", [TOPIC]))
        assert sorted(p["object"] for p in seen) == ["A", "B"]
        assert objects(pq, f"{TOPIC}/") == [layout.topic_marker_key(TOPIC)]


def test_a_batch_claim_of_one_key_twice_claims_it_once() -> None:
    """The protocol itself: a key given twice is written and won once, by its first
    claim (before: both claims got the token of whichever PUT was recorded last)."""
    from pawn_queue_sync.protocol.effects import run
    from pawn_queue_sync.protocol.lease import CsprngSettings, LeaseBody, claim_csprng_batch

    store = MemoryStore()
    clock = SystemClock()
    now = clock.now()
    key = "t/leases/x.lease"
    first, second = (LeaseBody.new(c, "x", now, 30.0) for c in ("first", "second"))
    cfg = CsprngSettings(jitter_min_ms=5, jitter_max_ms=5, verify_retries=0,
                         verify_retry_delay_ms=0)
    tokens = run(claim_csprng_batch("t/leases/", [(key, first), (key, second)],
                                    clock.monotonic(), cfg), store, clock)
    assert tokens == [store.head(key).etag, None]
    assert store.get(key).body == first.encode()


def test_a_late_loss_of_an_old_copy_leaves_the_new_claim_of_the_id_in_flight() -> None:
    """``_inflight`` is keyed by id. A handler outlived its lease, which went stale; our
    next poll reaped it and claimed the message again (a new Message, same id); the
    old copy's refresh then finds the lease lost. Before: settling the old copy removed
    the new one from ``inflight()``."""
    clock, pq, consumer, old = one_claimed(visibility_timeout_seconds=5)
    clock.jump(8)  # stale by the server's clock: the next poll reaps it
    (new,) = consumer.poll()
    assert (new.id, new is old) == (old.id, False)
    with pytest.raises(LeaseLostError):
        old.refresh()
    assert old.state == "lost"
    assert consumer.inflight() == [new]
    new.ack()
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


# -- 2. too short a visibility timeout ----------------------------------------------------------


@pytest.mark.parametrize("visibility", [0.5, 1, 2, 2.9])
def test_a_visibility_timeout_the_fence_cannot_work_with_is_rejected(visibility: float) -> None:
    """Before: accepted, and then no ack ever passed the fence (margin >= timeout)."""
    with pytest.raises(ConfigError, match=r"polling\.visibility_timeout_seconds") as info:
        load_config({"polling": {"visibility_timeout_seconds": visibility,
                                 "lease_refresh_interval_seconds": 0.25}})
    assert "fence" in str(info.value) and "at least 3" in str(info.value)


def test_the_least_visibility_timeout_acks_an_old_lease() -> None:
    clock, pq, consumer, msg = one_claimed(visibility_timeout_seconds=3)
    clock.jump(2.5)  # past the fence (3 - 2 s) but not stale: re-proven, then deleted
    consumer.ack(msg)
    assert msg.state == "acked"
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


# -- 3. a large ack of old leases ----------------------------------------------------------------


def test_a_large_ack_of_old_leases_acks_them_all() -> None:
    """600 leases 9 s old (visibility 10 s: past the 8 s fence, not stale), each lease
    PUT taking 20 ms. Before: re-proven one at a time (12 s a round), so the first ones
    aged out again while the last were proven, and after three rounds ~half were
    reported lost though nobody touched them."""
    clock = JumpClock()
    slow = threading.Event()

    def latency(op: str, key: str) -> None:
        if slow.is_set() and op == "put" and "/leases/" in key:
            threading.Event().wait(0.02)  # a store answering in 20 ms

    store = MemoryStore(clock, hooks=latency)
    pq = memory_queue(store=store, clock=clock, visibility_timeout_seconds=10,
                      lease_refresh_interval_seconds=5)
    pq.register_producer("p").publish_batch(TOPIC, range(600))
    consumer = pq.register_consumer("c", [TOPIC])
    msgs = consumer.poll(600)
    assert len(msgs) == 600
    clock.jump(9)
    slow.set()
    consumer.ack_many(msgs)
    assert Counter(m.state for m in msgs) == {"acked": 600}
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


def test_an_ack_reports_lost_only_the_leases_taken_and_acks_the_rest() -> None:
    clock = JumpClock()
    pq = memory_queue(clock=clock, visibility_timeout_seconds=10,
                      lease_refresh_interval_seconds=5)
    pq.register_producer("p").publish_batch(TOPIC, range(5))
    consumer = pq.register_consumer("c", [TOPIC])
    msgs = consumer.poll(5)
    clock.jump(9)
    taken = msgs[2]
    pq.store.put(taken.lease_key, b'{"someone":"else"}')  # another consumer's lease
    with pytest.raises(LeaseLostError, match="1 message"):
        consumer.ack_many(msgs)
    assert [m.state for m in msgs] == ["acked", "acked", "lost", "acked", "acked"]
    assert objects(pq, f"{TOPIC}/messages/") == [taken.key]
    assert objects(pq, f"{TOPIC}/leases/") == [taken.lease_key]
    pq.teardown()


# -- 4. a multi-topic poll whose second topic fails -------------------------------------------


def test_a_failing_topic_does_not_throw_away_what_a_poll_claimed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = {"on": False}

    def hooks(op: str, key: str) -> None:
        if broken["on"] and op == "list" and key.startswith("bad/"):
            raise StorageError("injected: listing failed")

    pq = memory_queue(store=MemoryStore(hooks=hooks), topics=(TOPIC, "bad"))
    producer = pq.register_producer("p")
    consumer = pq.register_consumer("c", [TOPIC, "bad"])
    broken["on"] = True
    producer.publish_batch(TOPIC, range(4))
    with caplog.at_level(logging.WARNING):
        first = consumer.poll(10)  # jobs first (claims 4), then bad (fails)
        assert sorted(m.payload for m in first) == [0, 1, 2, 3]
        consumer.ack_many(first)
        producer.publish_batch(TOPIC, range(4, 7))
        second = consumer.poll(10)  # bad first (fails), then jobs
    assert sorted(m.payload for m in second) == [4, 5, 6]
    assert sorted(m.payload for m in consumer.inflight()) == [4, 5, 6]
    assert sum("'bad'" in r.getMessage() for r in caplog.records) == 2
    consumer.ack_many(second)
    # Nothing claimed at all: the error is raised (the listener backs off), naming the topic.
    with pytest.raises(StorageError, match="'bad'"):
        consumer.poll(10)
    pq.teardown()


# -- 5. an ack racing a refresh ------------------------------------------------------------------


class _AfterDelete(MemoryStore):
    """A MemoryStore that sets ``deleted`` once ``watch`` has been deleted."""

    def __init__(self, hooks: Callable[[str, str], None]) -> None:
        super().__init__(hooks=hooks)
        self.watch: str | None = None
        self.deleted = threading.Event()

    def delete(self, key: str, *, if_match: str | None = None,
               deadline: float | None = None, retry_by: float | None = None) -> None:
        super().delete(key, if_match=if_match, deadline=deadline, retry_by=retry_by)
        if key == self.watch:
            self.deleted.set()


class _Signalling:
    """Wraps a lock; sets ``event`` when a thread has to wait for it."""

    def __init__(self, lock: Any, event: threading.Event) -> None:
        self._lock, self._event = lock, event

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        self._event.set()
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_refresh_in_flight_when_the_ack_deletes_does_not_turn_it_lost() -> None:
    """The refresh's PUT is held until the ack has deleted the lease, or until the ack
    waits for the refresh (what it must do). Before: the ack deleted under the
    refresh, the refresh's If-Match failed and flipped the acked message to lost."""
    hold = threading.Event()  # the refresh's PUT has reached the store
    go = threading.Event()  # ... and may go on

    def hooks(op: str, key: str) -> None:
        if op == "put" and key == store.watch and not hold.is_set():
            hold.set()
            assert go.wait(DEADLINE)

    store = _AfterDelete(hooks)
    store.deleted = go
    pq = memory_queue(store=store)
    pq.register_producer("p").publish(TOPIC, 1)
    consumer = pq.register_consumer("c", [TOPIC])
    (msg,) = consumer.poll()
    store.watch = msg.lease_key
    msg._lock = _Signalling(msg._lock, go)
    with ThreadPoolExecutor(2) as pool:
        refreshing = pool.submit(consumer.refresh, msg)
        assert hold.wait(DEADLINE)
        acking = pool.submit(consumer.ack, msg)
        acking.result(DEADLINE)
        refreshing.result(DEADLINE)  # no LeaseLostError
    assert msg.state == "acked"
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


@pytest.mark.parametrize("blocked", ["message", "lease"])
def test_a_refresh_during_an_ack_does_nothing(blocked: str) -> None:
    """The ack is held at its DELETE of the message (or of the lease); a refresh then
    must neither write the lease again nor report a loss. Before: it rewrote the
    lease (held at the message) or raised LeaseLostError (held at the lease)."""
    at = threading.Event()
    go = threading.Event()
    lease_puts: list[str] = []
    watch: dict[str, str] = {}

    def hooks(op: str, key: str) -> None:
        if op == "put" and key == watch.get("lease"):
            lease_puts.append(key)
        if op == "delete" and key == watch.get(blocked):
            at.set()
            assert go.wait(DEADLINE)

    pq = memory_queue(store=MemoryStore(hooks=hooks))
    pq.register_producer("p").publish(TOPIC, 1)
    consumer = pq.register_consumer("c", [TOPIC])
    (msg,) = consumer.poll()
    watch.update(message=msg.key, lease=msg.lease_key)
    with ThreadPoolExecutor(1) as pool:
        acking = pool.submit(consumer.ack, msg)
        assert at.wait(DEADLINE)
        try:
            consumer.refresh(msg)
            assert lease_puts == []
            assert msg.state != "lost"
        finally:
            go.set()
        acking.result(DEADLINE)
    assert msg.state == "acked"
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


# -- 8. an ack's DELETE that would land after the fence ------------------------------------


def test_an_ack_delete_held_past_the_fence_is_not_sent_and_the_new_holder_keeps_it() -> None:
    """The ack checks its fence (fresh), then its DELETE is held up (a stalled process,
    botocore's retries) until the lease is stale and another consumer has taken the
    message. Before: the DELETE went out anyway and removed the new holder's message.
    Now no attempt leaves after the fence: the ack fails, the message stays leased
    (an ack retried later finds the lease taken: lost), and the new holder has it."""
    clock = JumpClock()
    b_got: list[Any] = []

    def stall(op: str, key: str) -> None:
        if op == "delete" and key == watch.get("key") and not b_got:
            clock.jump(10 + 3)  # stale by the server's clock too
            b_got.extend(b.poll())

    watch: dict[str, str] = {}
    pq = memory_queue(store=MemoryStore(clock, hooks=stall), clock=clock,
                      visibility_timeout_seconds=10, lease_refresh_interval_seconds=5)
    pq.register_producer("p").publish(TOPIC, {"n": 1})
    a = pq.register_consumer("a", [TOPIC])
    b = pq.register_consumer("b", [TOPIC])
    (msg,) = a.poll()
    watch["key"] = msg.key
    with pytest.raises(StorageError, match="not acked"):
        a.ack(msg)
    assert msg.state == "leased"
    assert [m.id for m in b_got] == [msg.id]
    assert objects(pq, f"{TOPIC}/messages/") == [msg.key]  # the new holder's message
    with pytest.raises(LeaseLostError):
        a.ack(msg)
    assert msg.state == "lost"
    b_got[0].ack()
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


# -- 6. lease tokens are the ETags the server returns --------------------------------------------


class OpaqueEtags(MemoryStore):
    """A store whose ETags are not the MD5 of the body (SSE-KMS, some gateways) and
    which ignores conditional headers (so the queue runs csprng_verify without If-Match)."""

    def put(self, key: str, body: bytes, *, if_none_match: bool = False,
            if_match: str | None = None, deadline: float | None = None,
            retry_by: float | None = None) -> PutResult:
        self._check_key(key)
        self._before("put", key)
        etag = secrets.token_hex(16)
        with self._lock:
            now = self._clock.now()
            self._objects[key] = _Object(bytes(body), etag, now)
        return PutResult(key=key, etag=etag, server_time=now)

    def delete(self, key: str, *, if_match: str | None = None,
               deadline: float | None = None, retry_by: float | None = None) -> None:
        super().delete(key, deadline=deadline, retry_by=retry_by)


@pytest.mark.parametrize("strategy", ["csprng_batch", "csprng_per_key"])
def test_claims_and_refreshes_verify_by_the_etag_the_server_returns(strategy: str) -> None:
    """Before: the token was the MD5 of the body, so no claim ever verified here."""
    pq = memory_queue(strategy, store=OpaqueEtags())
    assert (pq.context.caps.if_none_match, pq.context.caps.if_match) == (False, False)
    pq.register_producer("p").publish_batch(TOPIC, range(3))
    consumer = pq.register_consumer("c", [TOPIC])
    msgs = consumer.poll(3)
    assert sorted(m.payload for m in msgs) == [0, 1, 2]
    for msg in msgs:
        assert msg.lease_token == pq.store.head(msg.lease_key).etag
        consumer.refresh(msg)  # check, write, check again: with the returned ETag
        assert msg.lease_token == pq.store.head(msg.lease_key).etag
    consumer.release(msgs[0])  # HEAD-then-DELETE: must recognise our token
    assert objects(pq, f"{TOPIC}/leases/") == sorted(m.lease_key for m in msgs[1:])
    consumer.ack_many(msgs[1:])
    assert objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


@settings(FAST, max_examples=60)
@given(worlds().map(lambda w: attrs.evolve(w, opaque_etags=True)))
def test_batch_and_single_claims_with_opaque_etags_only_the_stored_writer_believes(w):
    """The hypothesis worlds of test_protocol_csprng_batch, on a server whose ETags
    are unrelated to the bytes: the believer of a key is exactly its stored writer
    (before: nobody ever believed)."""
    check(w)


# -- 7. poll(0), pools, fork --------------------------------------------------------------------


def test_poll_zero_claims_nothing_and_negative_is_an_error() -> None:
    pq = memory_queue()
    pq.register_producer("p").publish_batch(TOPIC, range(3))
    consumer = pq.register_consumer("c", [TOPIC])
    assert consumer.poll(0) == []
    assert consumer.inflight() == []
    with pytest.raises(ValueError, match="max_messages"):
        consumer.poll(-1)
    assert len(consumer.poll(2)) == 2
    pq.teardown()


def test_a_pool_asked_again_with_more_workers_grows() -> None:
    pq = memory_queue()
    ctx = pq.context
    small = ctx.pool("work", 2)
    assert small._max_workers == 2
    assert ctx.pool("work", 1) is small  # fewer: the larger stands
    big = ctx.pool("work", 6)
    assert big._max_workers == 6
    assert ctx.pool("work", 6) is big
    together = threading.Barrier(6, timeout=10)  # passes only with 6 threads at once
    futures = [big.submit(together.wait) for _ in range(6)]
    assert sorted(f.result(DEADLINE) for f in futures) == list(range(6))
    assert small.submit(lambda: 42).result(DEADLINE) == 42  # an old holder still works
    pq.teardown()


def test_locks_held_by_another_thread_at_fork_are_free_in_the_child() -> None:
    pq = memory_queue()
    pq.register_producer("p").publish(TOPIC, 1)
    consumer = pq.register_consumer("c", [TOPIC])
    (msg,) = consumer.poll()
    ctx = pq.context
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with ctx._lock, consumer._lock, msg._lock:
            holding.set()
            done.wait(DEADLINE)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(DEADLINE)
    pid = os.fork()
    if pid == 0:  # the child: each of these takes one of the locks held above
        code = 1
        try:
            signal.alarm(10)  # a lock never freed: the child dies, the test fails
            ctx.pool("after-fork", 1).submit(int).result(5)
            assert consumer.inflight() == [msg]
            msg.release()
            code = 0 if msg.state == "released" else 3
        finally:
            os._exit(code)
    done.set()
    holder.join(DEADLINE)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    pq.teardown()

