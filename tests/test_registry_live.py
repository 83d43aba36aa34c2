"""Consumer liveness in the registry: heartbeats and a rank among live consumers only.

A consumer that polls rewrites its registry entry (``last_seen``) at most once per
``registry.heartbeat_interval_seconds``; ``registry.rank`` counts the consumers whose
entry the server saw written within ``LIVENESS_HEARTBEATS`` intervals (judged from the
LIST's LastModified against the listing's server time). Pure logic on MemoryStore with
a FakeClock; the end-to-end behaviour on SeaweedFS.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from pawn_queue_sync import PawnQueue, layout, load_config
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.errors import StorageError
from pawn_queue_sync.queue import registry
from pawn_queue_sync.queue.registry import LIVENESS_HEARTBEATS, stable_id
from pawn_queue_sync.storage.base import Listing
from pawn_queue_sync.storage.memory import MemoryStore
from tests.servers import S3Server, config_dict

TOPIC = "jobs"
#: heartbeat interval of the in-memory tests (virtual seconds)
EVERY = 10.0
ENTRY_FIELDS = {"role", "name", "entity_id", "registered_at", "last_seen"}


def memory_queue(clock: FakeClock, store: MemoryStore | None = None) -> PawnQueue:
    config = load_config({"registry": {"heartbeat_interval_seconds": EVERY},
                          "polling": {"jitter_max_ms": 0}})
    pq = PawnQueue(config, store=store or MemoryStore(clock), clock=clock).setup()
    pq.create_topic(TOPIC)
    return pq


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pq(clock: FakeClock) -> Iterator[PawnQueue]:
    queue = memory_queue(clock)
    yield queue
    queue.close()


def entry_of(pq: PawnQueue, consumer_id: str) -> dict[str, Any]:
    body = pq.store.get(layout.registry_key("consumers", consumer_id)).body
    doc: dict[str, Any] = json.loads(body)
    return doc


def test_rank_counts_only_consumers_written_within_the_liveness_window(
    pq: PawnQueue, clock: FakeClock
) -> None:
    """Two consumers register; only c1 goes on polling (so heartbeating). Until the
    window has passed since c2's last write c2 is counted, afterwards not; c2 is
    counted again once it registers again."""
    c1 = pq.register_consumer("c1", [TOPIC])
    c2 = pq.register_consumer("c2", [TOPIC])
    ctx = pq.context
    assert registry.rank(ctx, "consumers", c1.id)[1] == 2
    window = LIVENESS_HEARTBEATS * EVERY
    waited = 0.0
    while waited + EVERY / 2 <= window:  # up to the edge of the window, c1 polling
        clock.advance(EVERY / 2)
        waited += EVERY / 2
        c1.poll()
        assert registry.rank(ctx, "consumers", c1.id)[1] == 2, waited
    clock.advance(1.0)  # c2 was last written just over the window ago
    c1.poll()
    assert registry.rank(ctx, "consumers", c1.id) == (0, 1)
    # c1 is kept alive by its heartbeats: c2 (counting itself) sees it
    assert registry.rank(ctx, "consumers", c2.id)[1] == 2
    # a consumer that registers again (a restart) is alive again
    assert pq.register_consumer("c2", [TOPIC]).id == c2.id
    assert registry.rank(ctx, "consumers", c1.id)[1] == 2


def test_polls_heartbeat_at_most_once_per_interval_in_pawn_queues_shape(
    clock: FakeClock,
) -> None:
    puts: list[str] = []
    lists: list[str] = []

    def count(op: str, key: str) -> None:
        if op == "put" and key.startswith(layout.REGISTRY_PREFIX):
            puts.append(key)
        if op == "list" and key.startswith(layout.REGISTRY_PREFIX):
            lists.append(key)

    pq = memory_queue(clock, MemoryStore(clock, hooks=count))
    try:
        consumer = pq.register_consumer("c", [TOPIC])
        pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(60)])
        key = layout.registry_key("consumers", consumer.id)
        first = entry_of(pq, consumer.id)
        puts.clear()
        lists.clear()
        for _ in range(9):  # 9 polls within one interval: no write
            clock.advance(EVERY / 10)
            for msg in consumer.poll(2):
                msg.ack()
        assert puts == []
        clock.advance(EVERY / 10)
        for _ in range(9):  # the interval is over: one write, however many polls
            consumer.poll(2)
            clock.advance(EVERY / 20)
        assert puts == [key]
        assert len(lists) <= 2  # rank: one LIST an interval at most, as before
        beat = entry_of(pq, consumer.id)
        assert set(beat) == ENTRY_FIELDS  # pawn-queue's JSON shape, nothing added
        assert beat["registered_at"] == first["registered_at"]
        assert beat["entity_id"] == consumer.id and beat["name"] == "c"
        assert beat["last_seen"] > first["last_seen"]
        clock.advance(EVERY)
        consumer.poll(1)
        assert puts == [key, key]
    finally:
        pq.close()


def test_a_failed_heartbeat_only_logs_and_is_tried_again_an_interval_later(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    failing = {"on": False}
    tries: list[str] = []

    def fail_registry_puts(op: str, key: str) -> None:
        if failing["on"] and op == "put" and key.startswith(layout.REGISTRY_PREFIX):
            tries.append(key)
            raise StorageError("registry unavailable", key=key)

    pq = memory_queue(clock, MemoryStore(clock, hooks=fail_registry_puts))
    try:
        consumer = pq.register_consumer("c", [TOPIC])
        ids = pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(5)])
        failing["on"] = True
        clock.advance(EVERY)
        with caplog.at_level(logging.WARNING):
            got = consumer.poll(5)
        assert sorted(m.id for m in got) == sorted(ids)  # the poll is unaffected
        assert len(tries) == 1 and "heartbeat" in caplog.text
        for _ in range(5):
            clock.advance(EVERY / 10)
            consumer.poll()
        assert len(tries) == 1  # not a request per poll while the store refuses
        clock.advance(EVERY)
        failing["on"] = False
        consumer.poll()
        assert entry_of(pq, consumer.id)["last_seen"] == layout.iso(clock.now())
    finally:
        pq.close()


class _NoDate(MemoryStore):
    """A store whose listings do not say the server's time."""

    def list(self, prefix: str, **kwargs: Any) -> Listing:
        return attrs.evolve(super().list(prefix, **kwargs), server_time=None)


def test_rank_without_a_server_time_counts_every_consumer(clock: FakeClock) -> None:
    """The client clock never judges liveness: with no server time, all count."""
    pq = memory_queue(clock, _NoDate(clock))
    try:
        c1 = pq.register_consumer("c1", [TOPIC])
        pq.register_consumer("c2", [TOPIC])
        clock.advance(100 * EVERY)
        assert registry.rank(pq.context, "consumers", c1.id) == (
            sorted([c1.id, stable_id("consumers", "c2")]).index(c1.id), 2)
    finally:
        pq.close()


def test_rank_is_one_list_and_counts_us_when_we_are_not_listed(
    clock: FakeClock,
) -> None:
    calls: list[tuple[str, str]] = []
    pq = memory_queue(clock, MemoryStore(clock, hooks=lambda op, key: calls.append((op, key))))
    try:
        pq.register_consumer("c1", [TOPIC])
        calls.clear()
        ghost = stable_id("consumers", "never-registered")
        assert registry.rank(pq.context, "consumers", ghost)[1] == 2
        assert calls == [("list", f"{layout.REGISTRY_PREFIX}consumers/")]
    finally:
        pq.close()


# -- SeaweedFS ---------------------------------------------------------------------------


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def test_on_seaweedfs_a_consumer_that_stops_polling_drops_out_of_the_rank(
    real_s3: S3Server, real_bucket: str
) -> None:
    every = 2.0
    cfg = config_dict(real_s3, real_bucket, registry={"heartbeat_interval_seconds": every},
                      polling={"jitter_max_ms": 0})
    with PawnQueue.from_config(cfg) as pq1, PawnQueue.from_config(cfg) as pq2:
        pq1.create_topic(TOPIC)
        c1 = pq1.register_consumer("c1", [TOPIC])
        c2 = pq2.register_consumer("c2", [TOPIC])
        assert registry.rank(pq1.context, "consumers", c1.id)[1] == 2

        def c2_gone() -> bool:
            c1.poll()  # polling keeps c1's entry fresh; c2 does nothing
            time.sleep(0.1)  # pace the polls of an empty topic (the event is server time)
            return registry.rank(pq1.context, "consumers", c1.id) == (0, 1)

        wait_for(c2_gone, "c2 to drop out of c1's rank")
        # not before the window had passed by the server's clock
        written = pq1.store.head(layout.registry_key("consumers", c2.id)).last_modified
        age = (pq1.store.server_time() - written).total_seconds()
        assert age > LIVENESS_HEARTBEATS * every
        # c1 is alive in c2's eyes: its heartbeats went on
        assert registry.rank(pq2.context, "consumers", c2.id)[1] == 2
        entry = json.loads(pq1.store.get(layout.registry_key("consumers", c1.id)).body)
        assert set(entry) == ENTRY_FIELDS
        assert entry["last_seen"] > entry["registered_at"]
