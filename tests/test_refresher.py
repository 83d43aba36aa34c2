"""The lease refresher under load, and the listener's accounting around it.

In-memory store (fault injection and a per-request latency need its hooks) on an
auto-advancing FakeClock (pawn_queue_sync.testing): every duration below is virtual,
so waits of seconds take milliseconds. A hook records when each lease object is
written and, once asked, makes every lease PUT take 0.2 s (slept on the clock), as
refreshes take on a loaded store (or on a csprng server, which sleeps
``2 x jitter_min`` per refresh). A lease can be judged stale once the server sees it
older than the visibility timeout (plus a 1 s grace, at 1 s resolution), so every
held lease must be written again within one visibility timeout of its last write:
the tests count the gaps that were longer.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from pawn_queue_sync import Message, PawnQueue, testing
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.errors import StorageError
from pawn_queue_sync.runtime import LeaseRefresher, Listener
from pawn_queue_sync.runtime import settler as settler_module
from pawn_queue_sync.storage.base import ConditionFailed
from tests.short_leases import POLLING
from tests.threads import join, run_in_thread, wait_until

TOPIC = "jobs"
#: How long one lease PUT takes once the store is slowed down.
LATENCY_S = 0.2
#: No test waits longer than this for anything: fail, never hang.
DEADLINE = 90.0


#: The clock of the test running now (each test gets a fresh one: see the fixture).
CLOCK = FakeClock(auto=True)


@pytest.fixture(autouse=True)
def clock() -> Iterator[FakeClock]:
    """A fresh auto-advancing virtual clock per test (hooks and handlers sleep on it)."""
    global CLOCK
    CLOCK = FakeClock(auto=True)
    yield CLOCK
    CLOCK.close()


def memory_queue(hooks: Callable[[str, str], None] | None = None,
                 **polling: Any) -> PawnQueue:
    return testing.memory_queue({"polling": {**POLLING, **polling}}, topics=[TOPIC],
                                clock=CLOCK, hooks=hooks)


def publish(pq: PawnQueue, n: int) -> list[str]:
    return pq.register_producer("producer").publish_batch(TOPIC, [{"n": i} for i in range(n)])


class LeaseWrites:
    """Store hook: records when each lease object is written (claims and refreshes);
    once ``slow`` is set, every lease PUT first takes ``LATENCY_S``."""

    def __init__(self) -> None:
        self.slow = threading.Event()
        self._lock = threading.Lock()
        self._writes: dict[str, list[float]] = defaultdict(list)

    def __call__(self, op: str, key: str) -> None:
        if op == "put" and key.endswith(".lease"):
            if self.slow.is_set():
                CLOCK.sleep(LATENCY_S)  # simulated request latency
            with self._lock:
                self._writes[key].append(CLOCK.monotonic())

    def count(self, key: str) -> int:
        with self._lock:
            return len(self._writes[key])

    def overdue(self, keys: Iterable[str], limit: float) -> bool:
        """Some lease was last written more than ``limit`` seconds ago."""
        now = CLOCK.monotonic()
        with self._lock:
            return any(now - self._writes[k][-1] > limit for k in keys)

    def late(self, keys: Iterable[str], limit: float, until: float) -> int:
        """Gaps longer than ``limit`` between a lease's writes (or from its last write
        to ``until``): each is a lease that could have been judged stale and taken."""
        with self._lock:
            late = 0
            for k in keys:
                times = [*self._writes[k], until]
                late += sum(b - a > limit for a, b in itertools.pairwise(times))
            return late


def claim(pq: PawnQueue, n: int) -> tuple[Any, list[Message]]:
    consumer = pq.register_consumer("c", [TOPIC])
    msgs: list[Message] = []
    while len(msgs) < n:
        got = consumer.poll(n - len(msgs))
        assert got, "the topic ran dry"
        msgs += got
    return consumer, msgs


def held_on_a_slow_store(
    pq: PawnQueue, writes: LeaseWrites, n: int
) -> tuple[list[Message], list[str], LeaseRefresher]:
    """*n* messages claimed, lease writes made slow from now on, and a refresher (1 s
    interval, not started) tracking them all: (messages, lease keys, refresher)."""
    publish(pq, n)
    consumer, msgs = claim(pq, n)
    writes.slow.set()
    refresher = LeaseRefresher(consumer, interval_seconds=1.0)
    for msg in msgs:
        refresher.track(msg)
    return msgs, [m.lease_key for m in msgs], refresher


# -- 1. many leases on a slow store ------------------------------------------------------


def test_120_held_leases_on_a_slow_store_are_each_renewed_before_they_could_go_stale(
) -> None:
    """120 leases, 0.2 s per refresh, renewed every second: one at a time that is a
    24 s round, so most leases would go 3 s (the visibility timeout) unrenewed. On
    ``claim_threads`` threads every lease is written again well within 3 s."""
    writes = LeaseWrites()
    pq = memory_queue(writes, claim_threads=48)
    try:
        msgs, keys, refresher = held_on_a_slow_store(pq, writes, 120)
        with refresher:
            # until every lease was renewed twice, or one went a visibility timeout
            # without a write (it could be taken: the old serial refresher does that)
            wait_until(lambda: all(writes.count(k) >= 3 for k in keys)
                       or writes.overdue(keys, 3.0), "two renewals of every lease")
            end = CLOCK.monotonic()
        assert writes.late(keys, 3.0, until=end) == 0
        assert all(m.state == "leased" for m in msgs)
        assert refresher.lost == 0 and refresher.errors == 0
    finally:
        pq.close()


def test_a_refresher_that_falls_behind_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """30 leases renewed each second on 2 threads at 0.2 s a refresh (10 a second):
    it cannot keep up, and it must say so rather than let leases expire silently."""
    writes = LeaseWrites()
    pq = memory_queue(writes, claim_threads=2)
    try:
        _msgs, keys, refresher = held_on_a_slow_store(pq, writes, 30)
        with caplog.at_level(logging.WARNING, logger="pawn_queue_sync.runtime.refresher"), \
                refresher:
            wait_until(lambda: all(writes.count(k) >= 3 for k in keys),
                       "two renewals of every lease")
        behind = [r for r in caplog.records if "behind" in r.getMessage()]
        assert behind, caplog.text
        assert "claim_threads" in behind[0].getMessage()  # says what to change
        assert refresher.late > 0
    finally:
        pq.close()


def test_due_leases_are_renewed_closest_to_expiry_first() -> None:
    """Eight leases all due, written at shuffled times: one thread renews the oldest
    (closest to expiry) first, whatever the order they were tracked in."""
    order: list[str] = []
    watching = threading.Event()

    def hooks(op: str, key: str) -> None:
        if watching.is_set() and op == "put" and key.endswith(".lease"):
            order.append(key)

    pq = memory_queue(hooks)
    try:
        publish(pq, 8)
        consumer, msgs = claim(pq, 8)
        now = pq.context.clock.monotonic()
        ages = [1.6, 1.1, 2.4, 1.3, 2.0, 1.5, 2.2, 1.2]  # all past the 1 s interval
        for msg, age in zip(msgs, ages, strict=True):
            msg.lease_written_at = now - age
        refresher = LeaseRefresher(consumer, interval_seconds=1.0, threads=1)
        for msg in msgs:
            refresher.track(msg)
        watching.set()
        with refresher:
            wait_until(lambda: len(order) >= 8, "eight renewals")
        by_age = sorted(zip(ages, msgs, strict=True), key=lambda p: -p[0])
        assert order[:8] == [m.lease_key for _, m in by_age]
    finally:
        pq.close()


def test_leases_that_aged_in_a_slow_poll_are_renewed_together_before_handlers_start(
) -> None:
    """A poll whose reads take 1.2 s returns ten leases older than the refresh
    interval; they are renewed before their handlers start (0.3 s a renewal). One
    after another that is 3 s, so the first handlers would start on leases renewed
    ~2.7 s earlier; together, every handler starts on a lease under an interval old."""
    def hooks(op: str, key: str) -> None:
        if op == "get" and "/messages/" in key:
            CLOCK.sleep(1.2)  # simulated slow read
        elif op == "put" and key.endswith(".lease"):
            CLOCK.sleep(0.3)  # simulated slow write

    # visibility 5 s: a renewal is due after 1 s (the interval), well within the fence
    pq = memory_queue(hooks, claim_threads=16, visibility_timeout_seconds=5)
    try:
        publish(pq, 10)
        consumer = pq.register_consumer("c", [TOPIC])
        lock = threading.Lock()
        ages: list[float] = []

        def handler(msg: Message) -> None:
            with lock:
                ages.append(consumer.lease_age(msg))

        listener = Listener(consumer, handler, max_workers=10, max_messages=10)
        join(run_in_thread(listener.run))
        assert len(ages) == 10
        assert max(ages) < 1.0, sorted(ages)
        assert listener.stats.processed == 10
    finally:
        pq.close()


def test_a_lease_whose_ack_is_under_way_is_looked_at_again_later_not_in_a_loop(
    mem_queue_1: tuple[PawnQueue, Any, Message],
) -> None:
    """While an ack of a message is under way, refresh() writes nothing (the consumer
    lets the ack have it). The refresher must then look again after a pause, not
    call refresh() over and over until the ack ends."""
    _pq, consumer, msg = mem_queue_1
    calls: list[float] = []
    first = threading.Event()
    refresh = consumer.refresh

    def counting_refresh(m: Message) -> None:
        calls.append(CLOCK.monotonic())
        first.set()
        refresh(m)

    consumer.refresh = counting_refresh  # type: ignore[method-assign]
    msg._settling = True  # an ack of it is under way (as ack_many marks it)
    msg.lease_written_at -= 2.0  # due now
    refresher = LeaseRefresher(consumer, interval_seconds=1.0)
    refresher.track(msg)
    with refresher:
        assert first.wait(DEADLINE)
        CLOCK.sleep(0.3)  # a spinning refresher calls refresh() thousands of times here
    assert len(calls) <= 2, len(calls)
    assert refresher.refreshes == 0  # nothing was renewed


@pytest.fixture
def mem_queue_1() -> Any:
    """A queue on the memory store and one message claimed by consumer "c"."""
    pq = memory_queue()
    try:
        publish(pq, 1)
        consumer, [msg] = claim(pq, 1)
        yield pq, consumer, msg
    finally:
        pq.close()


# -- 2. a message waiting for its retry keeps its lease -----------------------------------


def test_a_message_waiting_for_its_retry_among_150_held_is_dead_lettered_after_n_deliveries(
) -> None:
    """150 handled messages wait in the ack batch (held, renewed) while one message
    fails and waits out a 6 s backoff, longer than its lease lives unrenewed (stale
    after 4-5 s, and the listener's own polls reap stale leases). Its lease must be
    renewed through the wait, so the attempt is recorded: deliveries 1, 2, 3, then
    dead-letter, never a delivery repeating a count; nothing else is delivered twice."""
    writes = LeaseWrites()
    writes.slow.set()
    # visibility 4 s: the fence trusts 2 s, so the acks at the end need no refresh
    pq = memory_queue(writes, claim_threads=48, visibility_timeout_seconds=4,
                      max_messages_per_poll=50)
    try:
        publish(pq, 150)
        [failing] = publish(pq, 1)
        lock = threading.Lock()
        deliveries: dict[str, list[int]] = defaultdict(list)

        def handler(msg: Message) -> None:
            with lock:
                deliveries[msg.id].append(msg.delivery_count)
            if msg.id == failing:
                raise RuntimeError("always fails")

        def finished() -> bool:
            with lock:
                counts = list(deliveries[failing])
            repeated = len(set(counts)) < len(counts)
            return repeated or pq.topic_stats(TOPIC)["dead_letter"] == 1

        listener = Listener(pq.register_consumer("c", [TOPIC]), handler, max_workers=16,
                            ack_batch_size=1000, ack_flush_interval_seconds=DEADLINE,
                            retry_backoff_seconds=6.0, retry_backoff_max_seconds=6.0)
        runner = run_in_thread(listener.run)
        wait_until(finished, "the failing message to be dead-lettered")
        listener.stop()
        join(runner)
        assert deliveries[failing] == [1, 2, 3]
        assert len(deliveries) == 151
        assert [mid for mid, counts in deliveries.items() if len(counts) > 1] == [failing]
        s = listener.stats
        assert (s.processed, s.failed, s.dead_lettered, s.lost) == (150, 2, 1, 0)
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 1}
    finally:
        pq.close()


# -- 3. processed counts acks that happened -----------------------------------------------


def test_a_message_whose_ack_finds_its_lease_lost_is_counted_lost_not_processed() -> None:
    """The handler returns, but the lease was taken meanwhile (the hook answers every
    lease write as another consumer's lease would: 412) and the lease is past the
    ack fence, so the ack must re-prove it and fails: nothing is deleted, and the
    message is counted lost, never processed."""
    taken = threading.Event()

    def hooks(op: str, key: str) -> None:
        if taken.is_set() and op == "put" and key.endswith(".lease"):
            raise ConditionFailed("injected: another consumer's lease", key=key)

    pq = memory_queue(hooks)
    try:
        publish(pq, 1)

        def handler(msg: Message) -> None:
            taken.set()
            msg.lease_written_at -= 100.0  # as if the handler had run past the fence

        listener = Listener(pq.register_consumer("c", [TOPIC]), handler, max_workers=1,
                            max_messages=1)
        join(run_in_thread(listener.run))
        assert (listener.stats.processed, listener.stats.lost) == (0, 1)
        assert pq.topic_stats(TOPIC)["pending"] == 1  # not acked: it will be redelivered
    finally:
        pq.close()


def test_a_message_whose_ack_never_succeeds_is_not_counted_processed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every DELETE of the message fails: the ack is retried, then given up at stop.
    The message was never acked, so it is not processed (it will be redelivered)."""
    monkeypatch.setattr(settler_module, "ACK_ERROR_WAIT_S", 2.5)  # one retry, then give up
    ack_failed = threading.Event()

    def hooks(op: str, key: str) -> None:
        if op in ("delete", "delete_many") and "/messages/" in key:
            ack_failed.set()
            raise StorageError("injected: DELETE failed", key=key)

    pq = memory_queue(hooks)
    try:
        publish(pq, 1)
        listener = Listener(pq.register_consumer("c", [TOPIC]), lambda m: None,
                            max_workers=1, max_messages=1)
        runner = run_in_thread(listener.run)
        assert ack_failed.wait(DEADLINE)
        listener.stop()
        join(runner)
        assert listener.stats.ack_errors >= 2
        assert (listener.stats.processed, listener.stats.lost) == (0, 1)
        assert pq.topic_stats(TOPIC)["pending"] == 1
    finally:
        pq.close()


# -- 4. an ack never races a refresh -------------------------------------------------------


def test_a_refresh_in_flight_when_the_ack_comes_does_not_turn_the_ack_into_a_loss() -> None:
    """The handler returns while a refresh of its lease is in flight (held in the
    store hook until the lease is deleted, or 2 s). The ack must not delete the lease
    under that refresh: the message ends acked, never "lost", and nothing counts a
    loss. Visibility 5 s: the fence trusts a lease for 3 s, so the ack deletes without
    asking the server (which would wait for the refresh)."""
    armed = threading.Event()
    refresh_in_flight = threading.Event()
    lease_deleted = threading.Event()
    lease_key: list[str] = []

    def hooks(op: str, key: str) -> None:
        if armed.is_set() and op == "put" and lease_key and key == lease_key[0]:
            armed.clear()
            refresh_in_flight.set()
            # bounded (2 s on the clock): a correct ack waits for this refresh
            until = CLOCK.monotonic() + 2.0
            while not lease_deleted.is_set() and CLOCK.monotonic() < until:
                CLOCK.sleep(0.05)

    pq = memory_queue(hooks, visibility_timeout_seconds=5)
    store = pq.store
    delete, delete_many = store.delete, store.delete_many

    def tracking_delete(key: str, **kw: Any) -> None:
        delete(key, **kw)
        if lease_key and key == lease_key[0]:
            lease_deleted.set()

    def tracking_delete_many(keys: Any, **kw: Any) -> list[str]:
        keys = list(keys)
        failed = delete_many(keys, **kw)
        if lease_key and lease_key[0] in keys:
            lease_deleted.set()
        return failed

    store.delete = tracking_delete  # type: ignore[method-assign]
    store.delete_many = tracking_delete_many  # type: ignore[method-assign]
    try:
        publish(pq, 1)
        handled: list[Message] = []

        def handler(msg: Message) -> None:
            handled.append(msg)
            lease_key.append(msg.lease_key)
            armed.set()
            assert refresh_in_flight.wait(DEADLINE)  # the refresher is mid-request

        listener = Listener(pq.register_consumer("c", [TOPIC]), handler, max_workers=1,
                            max_messages=1)
        join(run_in_thread(listener.run))
        [msg] = handled
        assert msg.state == "acked"
        assert listener.refresher.lost == 0
        s = listener.stats
        assert (s.processed, s.lost) == (1, 0)
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    finally:
        pq.close()
