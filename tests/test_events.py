"""Events (issue 16): ``PawnQueue(on_event=...)`` and ``register_consumer(...,
on_event=...)`` receive typed events, counted exactly here (each message published
once, claimed, acked), on plain and packed topics, against SeaweedFS and the local
store; the kinds a failure makes (retried, nacked, dead_lettered, redriven, reaped,
lease_lost, poll_error) on a memory store with a manual clock; a slow or raising
callback never blocks nor breaks the hot path (asserted by counts: events dropped,
messages consumed); a forked child delivers its own events, never its parent's."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import LeaseLostError, PawnQueue, StorageError, drain, load_config
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.events import KINDS, Event, EventBus
from pawn_queue_sync.testing import memory_queue
from tests.forking import in_child
from tests.servers import S3Server, config_dict

TOPIC = "evt"
MESSAGES = 60


class Recorder:
    """An on_event callback keeping every event (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def kinds(self) -> Counter[str]:
        with self._lock:
            return Counter(e.kind for e in self.events)

    def ids(self, kind: str) -> Counter[str | None]:
        with self._lock:
            return Counter(e.message_id for e in self.events if e.kind == kind)

    def of(self, kind: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.kind == kind]


def _config(store: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    polling = {"interval_seconds": 0.1, "max_messages_per_poll": 10}
    if store == "local":
        return {"local": {"path": str(tmp_path / "store")}, "polling": polling,
                "publishing": {"max_segment_messages": 7}}
    server: S3Server = request.getfixturevalue("real_s3")
    bucket: str = request.getfixturevalue("real_bucket")
    return config_dict(server, bucket, polling=polling,
                       publishing={"max_segment_messages": 7})


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("store", ["seaweedfs", "local"])
def test_each_message_is_published_claimed_and_acked_once(
    store: str, packed: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    everything, mine = Recorder(), Recorder()
    with PawnQueue(load_config(_config(store, tmp_path, request)),
                   on_event=everything) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("producer")
        ids = [producer.publish(TOPIC, {"n": i}) for i in range(10)]
        ids += producer.publish_batch(TOPIC, [{"n": i} for i in range(10, MESSAGES)])
        consumer = pq.register_consumer("consumer", [TOPIC], on_event=mine)
        result = drain(consumer, lambda msg: None, idle_timeout_seconds=1.0)
        assert result.processed == MESSAGES
        assert pq.events.flush(10)
        assert pq.events.dropped == 0 and pq.events.errors == 0
    want = Counter(ids)
    assert len(want) == MESSAGES
    assert everything.kinds() == {"published": MESSAGES, "claimed": MESSAGES,
                                  "acked": MESSAGES}
    for kind in ("published", "claimed", "acked"):
        assert everything.ids(kind) == want, kind
    # the consumer's own callback: its events only (no publish), the same ones
    assert mine.kinds() == {"claimed": MESSAGES, "acked": MESSAGES}
    assert mine.ids("acked") == want
    producer_ids = {e.producer_id for e in everything.of("published")}
    assert producer_ids == {producer.id}
    for event in everything.of("claimed") + everything.of("acked"):
        assert event.topic == TOPIC and event.consumer_id == consumer.id
        assert event.delivery_count == 1
    # the handler's run time under drain(); the publish call's time for publish()
    assert all(e.duration is not None and e.duration >= 0 for e in everything.of("acked"))
    timed = [e for e in everything.of("published") if e.duration is not None]
    assert sorted(e.message_id for e in timed) == sorted(ids[:10])


# -- failures, on a memory store and a manual clock ------------------------------------------


def _memory(clock: FakeClock, recorder: Recorder, **polling: Any) -> PawnQueue:
    pq = memory_queue({"polling": {"visibility_timeout_seconds": 12,
                                   "lease_refresh_interval_seconds": 4, **polling}},
                      clock=clock)
    pq.events.subscribe(recorder)
    return pq


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_retry_nack_dead_letter_and_redrive_events(packed: bool) -> None:
    clock, seen = FakeClock(), Recorder()
    pq = _memory(clock, seen, max_delivery_count=2)
    try:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        first, second = producer.publish(TOPIC, 1), producer.publish(TOPIC, 2)
        consumer = pq.register_consumer("c", [TOPIC])
        got = {m.id: m for m in consumer.poll(2)}
        got[first].nack("no good")
        consumer.retry(got[second], "boom")
        again = consumer.poll(1)
        assert [m.id for m in again] == [second] and again[0].delivery_count == 2
        consumer.retry(again[0], "boom again")
        assert consumer.poll(1) == []  # delivered twice: dead-lettered instead
        pq.events.flush(10)
        nacked, = seen.of("nacked")
        assert (nacked.message_id, nacked.error, nacked.delivery_count) == \
            (first, "no good", 1)
        assert [(e.message_id, e.error, e.delivery_count) for e in seen.of("retried")] == \
            [(second, "boom", 1), (second, "boom again", 2)]
        dead, = seen.of("dead_lettered")
        assert dead.message_id == second and "delivered 2 times" in (dead.error or "")
        assert seen.ids("claimed") == Counter({first: 1, second: 2})
        assert "acked" not in seen.kinds()

        result = pq.redrive(TOPIC)
        assert sorted(result.moved) == sorted([first, second])
        pq.events.flush(10)
        assert seen.ids("redriven") == Counter([first, second])
        assert all(e.consumer_id is None for e in seen.of("redriven"))
    finally:
        pq.close()


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_a_stale_lease_is_reaped_and_its_first_holder_loses_it(packed: bool) -> None:
    clock, seen = FakeClock(), Recorder()
    pq = _memory(clock, seen)
    try:
        pq.create_topic(TOPIC, packed=packed)
        mid = pq.register_producer("p").publish(TOPIC, "x")
        slow = pq.register_consumer("slow", [TOPIC])
        fast = pq.register_consumer("fast", [TOPIC])
        held, = slow.poll(1)
        clock.advance(30)  # past the visibility timeout: the lease is stale
        taken, = fast.poll(1)
        assert taken.id == mid and taken.delivery_count == 2
        with pytest.raises(LeaseLostError):
            held.ack()
        taken.ack()
        pq.events.flush(10)
        reaped, = seen.of("reaped")
        assert reaped.consumer_id == fast.id
        # a message's lease names the message; a segment's, the segment
        assert (reaped.message_id == mid) is (not packed)
        lost, = seen.of("lease_lost")
        assert (lost.message_id, lost.consumer_id) == (mid, slow.id)
        acked, = seen.of("acked")
        assert (acked.message_id, acked.consumer_id) == (mid, fast.id)
    finally:
        pq.close()


def test_a_failed_poll_is_a_poll_error_event() -> None:
    seen, broken = Recorder(), threading.Event()

    def hooks(op: str, key: str) -> None:
        if broken.is_set() and op == "list" and key.startswith(f"{TOPIC}/"):  # any listing
            raise StorageError("the store is down", key=key)

    pq = memory_queue(topics=[TOPIC], hooks=hooks)
    try:
        consumer = pq.register_consumer("c", [TOPIC], on_event=seen)
        broken.set()
        with pytest.raises(StorageError):
            consumer.poll(1)
        pq.events.flush(10)
        error, = seen.of("poll_error")
        assert (error.topic, error.message_id, error.consumer_id) == (TOPIC, None, consumer.id)
        assert "the store is down" in (error.error or "")
    finally:
        pq.close()


# -- callbacks that are slow or raise ------------------------------------------------------------


def test_a_blocked_callback_drops_events_and_never_blocks_consuming() -> None:
    entered, release = threading.Event(), threading.Event()
    seen = Recorder()

    def blocked(event: Event) -> None:
        entered.set()
        release.wait(60)
        seen(event)

    pq = memory_queue(topics=[TOPIC])
    bus = pq.events
    bus._max = 10  # a small queue, so it fills
    bus.subscribe(blocked)
    try:
        producer = pq.register_producer("p")
        producer.publish(TOPIC, 0)
        assert entered.wait(10)  # the dispatcher is stuck in the first event
        ids = [producer.publish(TOPIC, i) for i in range(1, MESSAGES)]
        consumer = pq.register_consumer("c", [TOPIC])
        consumed = 0
        while msgs := consumer.poll(10):
            consumer.ack_many(msgs)
            consumed += len(msgs)
        # everything published and consumed while the callback was stuck
        assert consumed == MESSAGES and len(set(ids)) == MESSAGES - 1
        # 3 events a message; one handed out, 10 queued, the rest dropped
        assert bus.dropped == 3 * MESSAGES - 11
        release.set()
        assert bus.flush(10)
        assert len(seen.events) == 11
    finally:
        release.set()
        pq.close()


def test_a_raising_callback_is_logged_once_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def raising(event: Event) -> None:
        raise RuntimeError("callback bug")

    seen = Recorder()
    pq = memory_queue(topics=[TOPIC])
    pq.events.subscribe(raising)
    pq.events.subscribe(seen)
    try:
        with caplog.at_level(logging.WARNING, logger="pawn_queue_sync.events"):
            producer = pq.register_producer("p")
            for i in range(MESSAGES):
                producer.publish(TOPIC, i)
            result = drain(pq.register_consumer("c", [TOPIC]), lambda m: None,
                           idle_timeout_seconds=0.5)
            assert result.processed == MESSAGES
            assert pq.events.flush(10)
        assert pq.events.errors == 3 * MESSAGES
        assert seen.kinds() == {"published": MESSAGES, "claimed": MESSAGES,
                                "acked": MESSAGES}
        logged = [r for r in caplog.records if "callback bug" in r.getMessage()]
        assert len(logged) == 1  # rate-limited: once a minute
    finally:
        pq.close()


# -- fork, the bus itself ---------------------------------------------------------------------


def test_a_forked_child_delivers_its_own_events_only(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    seen: list[tuple[int, str, str | None]] = []

    def callback(event: Event) -> None:
        if event.message_id == "stuck":
            entered.set()
            release.wait(60)
        seen.append((os.getpid(), event.kind, event.message_id))

    bus = EventBus([callback])
    clock = FakeClock()

    def event(mid: str) -> Event:
        return Event("published", TOPIC, mid, clock.now())

    try:
        bus.publish(event("stuck"))
        assert entered.wait(10)
        for i in range(5):  # queued in the parent at the fork
            bus.publish(event(f"parent-{i}"))
        out = tmp_path / "child.txt"

        def child() -> int:
            bus.publish(event("child"))
            if not bus.flush(10):
                return 3
            out.write_text(json.dumps(seen))
            return 0

        assert in_child(child) == 0
        child_seen = json.loads(out.read_text())
        # the child delivered its own event, on a thread of its own, and none of the
        # parent's queued ones (nor the one the parent's dispatcher was stuck in)
        assert [(kind, mid) for _, kind, mid in child_seen] == [("published", "child")]
        assert child_seen[0][0] != os.getpid()
        release.set()
        assert bus.flush(10)
        assert [mid for _, _, mid in seen] == ["stuck"] + [f"parent-{i}" for i in range(5)]
    finally:
        release.set()
        bus.close()


def test_close_hands_out_what_is_queued_then_drops_until_opened() -> None:
    seen = Recorder()
    bus = EventBus([seen])
    now = FakeClock().now()
    for i in range(20):
        assert bus.publish(Event("claimed", TOPIC, str(i), now))
    assert bus.close()
    assert [e.message_id for e in seen.events] == [str(i) for i in range(20)]
    assert not bus.publish(Event("acked", TOPIC, "late", now))
    assert bus.dropped == 1
    bus.open()
    assert bus.publish(Event("acked", TOPIC, "again", now))
    assert bus.flush(10) and seen.events[-1].message_id == "again"
    bus.close()


def test_an_event_names_a_known_kind_and_is_json_ready() -> None:
    now = FakeClock().now()
    with pytest.raises(ValueError, match="unknown event kind"):
        Event("exploded", TOPIC, None, now)
    doc = Event("poll_error", TOPIC, None, now, error="down").to_dict()
    assert doc["kind"] == "poll_error" and doc["at"] == now.isoformat()
    assert set(KINDS) == {"published", "claimed", "acked", "nacked", "retried",
                          "lease_lost", "dead_lettered", "redriven", "reaped", "poll_error"}
    with pytest.raises(TypeError, match="callable"):
        PawnQueue(None, on_event=42)  # type: ignore[arg-type]


def test_no_callback_means_no_event_is_built() -> None:
    pq = memory_queue(topics=[TOPIC])
    try:
        built: list[Any] = []
        original = Event.__init__

        def spy(self: Event, *args: Any, **kwargs: Any) -> None:
            built.append(args)
            original(self, *args, **kwargs)

        Event.__init__ = spy  # type: ignore[method-assign]
        try:
            pq.register_producer("p").publish(TOPIC, 1)
            consumer = pq.register_consumer("c", [TOPIC])
            consumer.ack_many(consumer.poll(1))
        finally:
            Event.__init__ = original  # type: ignore[method-assign]
        assert built == []
    finally:
        pq.close()


def test_close_waits_a_bounded_time_for_a_stuck_callback() -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck(event: Event) -> None:
        entered.set()
        release.wait(60)

    bus = EventBus([stuck])
    now = FakeClock().now()
    try:
        bus.publish(Event("claimed", TOPIC, "first", now))
        assert entered.wait(10)
        for i in range(7):
            bus.publish(Event("claimed", TOPIC, str(i), now))
        assert bus.close(timeout=0.1) is False  # gave up waiting: the 7 queued dropped
        assert bus.dropped == 7
    finally:
        release.set()
    assert bus.flush(10)  # the one in hand finished; nothing left
