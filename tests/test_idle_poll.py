"""An idle topic's poll is one LIST (queue/idle.py): it serves the promotion of
delayed messages and tells whether there is anything to claim. The listing's order on
SeaweedFS, moto and the local store; a delayed message on an otherwise idle topic
delivered by the first poll whose listing's server time finds it due (never before),
plain and packed; pages cut by many delayed keys or leases still deliver everything."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, layout
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.config import load_config
from pawn_queue_sync.queue import idle
from pawn_queue_sync.storage.base import Listing
from pawn_queue_sync.storage.factory import build_store
from pawn_queue_sync.testing import memory_queue
from tests.servers import deep_merge

TOPIC = "quiet"
FAST = {"polling": {"interval_seconds": 0.05}}
#: Seconds a test waits for a message before calling it lost.
DEADLINE = 60.0


class Recorded:
    """A store that forwards every call and records (method, key or prefix), and the
    listing each ``list`` returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self.listings: list[tuple[str, Listing]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name in ("describe",):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, str(args[0]) if args else ""))
            out = attr(*args, **kwargs)
            if name == "list":
                self.listings.append((str(args[0]), out))
            return out

        return call


@pytest.fixture(params=["seaweedfs", "moto", "local"])
def any_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A fresh bucket on SeaweedFS or moto, or a fresh local store."""
    if request.param == "local":
        base: dict[str, Any] = {"local": {"path": str(tmp_path / "store")}}
    else:
        server = request.getfixturevalue({"seaweedfs": "seaweedfs", "moto": "moto_s3"}
                                         [request.param])
        from tests.servers import config_dict
        base = config_dict(server, server.make_bucket())
    return deep_merge(base, FAST)


@pytest.fixture
def recorded(any_config: dict[str, Any]) -> Iterator[tuple[PawnQueue, Recorded]]:
    cfg = load_config(any_config)
    store = Recorded(build_store(cfg))
    with PawnQueue(cfg, store=store) as pq:  # type: ignore[arg-type]
        yield pq, store
    store.inner.close()


def _delayed(i: int, due: str) -> str:
    return layout.delayed_key(TOPIC, due, f"00000000-0000-4000-8000-{i:012d}", 5000)


def test_the_idle_listing_shows_every_section_in_order_on_every_store(
    recorded: tuple[PawnQueue, Recorded], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every section of a topic, with foreign siblings that SeaweedFS orders apart from
    bytes (``delayed.lock``, ``delayed-x``, ``messages.x``), and sections before the
    start (dead letters, dedup markers, the marker): a whole page holds exactly the
    sections' keys, delayed ones in due order; each cut page (of every length) holds a
    prefix of the delayed keys in order, and every section it calls complete is."""
    pq, _store = recorded
    delayed_keys = [_delayed(i, f"2027010{i}T000000_000000") for i in range(1, 4)]
    sections = {
        layout.DELAYED: delayed_keys,
        layout.LEASES: [f"{TOPIC}/leases/l{i}.lease" for i in range(3)],
        layout.MESSAGES: [f"{TOPIC}/messages/20260101T000000_00000{i}-x.json" for i in range(2)],
        layout.SEGMENT_LEASES: [f"{TOPIC}/segment-leases/s.lease"],
        layout.SEGMENTS: [f"{TOPIC}/segments/s{i}.seg" for i in range(2)],
    }
    others = [f"{TOPIC}/.topic", f"{TOPIC}/.packed", f"{TOPIC}/dead-letter/a.json",
              f"{TOPIC}/dedup/ab.json", f"{TOPIC}/dedup/zz.json"]
    siblings = [f"{TOPIC}/delayed.lock", f"{TOPIC}/delayed-x", f"{TOPIC}/messages.x",
                f"{TOPIC}/zzz", f"{TOPIC}x/messages/m.json"]
    for key in [k for keys in sections.values() for k in keys] + others + siblings:
        pq.store.put(key, b"{}")
    whole = idle.probe(pq.context, TOPIC)
    assert whole.complete == frozenset(idle.SECTIONS)
    assert {s: [o.key for o in objs] for s, objs in whole.sections.items()} == sections
    assert sorted(o.key for o in whole.listing.objects) == sorted(
        [k for keys in sections.values() for k in keys] + siblings[:4])
    total = len(whole.listing.objects)
    for page in range(1, total + 1):
        monkeypatch.setattr(idle, "PAGE", page)
        cut = idle.probe(pq.context, TOPIC)
        assert len(cut.listing.objects) == page and cut.listing.truncated == (page < total)
        shown = [o.key for o in cut.sections[layout.DELAYED]]
        assert shown == delayed_keys[: len(shown)], (page, shown)
        for section in cut.complete:
            assert [o.key for o in cut.sections[section]] == sections[section], (page, section)
        first = cut.listing_of(layout.DELAYED)
        if first is not None and not first.truncated:
            assert [o.key for o in first.objects] == delayed_keys, page


def _polls_until(pq: PawnQueue, store: Recorded, mid: str) -> list[tuple[list[str], Listing]]:
    """Register a consumer, then poll (about once an interval, as a listener does when
    idle) until ``mid`` comes; each poll's requests and its first listing."""
    consumer = pq.register_consumer("c", [TOPIC])
    polls: list[tuple[list[str], Listing]] = []
    end = time.monotonic() + DEADLINE
    store.calls.clear()
    while True:
        assert time.monotonic() < end, f"{mid} never delivered"
        calls, listings = len(store.calls), len(store.listings)
        got = consumer.poll()
        polls.append(([f"{op} {key}" for op, key in store.calls[calls:]
                       if not (op == "put" and key.startswith(layout.REGISTRY_PREFIX))],
                      store.listings[listings][1]))
        for msg in got:
            assert msg.id == mid
            msg.ack()
        if got:
            assert consumer.poll() == []  # once
            return polls
        time.sleep(pq.config.polling.interval_seconds)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_an_idle_topic_costs_one_list_a_poll_and_its_delayed_message_comes_once_due(
    recorded: tuple[PawnQueue, Recorded], packed: bool
) -> None:
    """Every poll before the delayed message is due is ONE request (registry
    heartbeats aside), a LIST of the topic: no GET, so no delayed body read; and the
    message comes in the first poll whose listing's server time finds it due
    (LastModified + delay, by the server's clock), never before: within about one poll
    interval after due."""
    pq, store = recorded
    pq.create_topic(TOPIC, packed=packed)
    producer = pq.register_producer("p")
    mid = producer.publish(TOPIC, {"n": 1}, delay_seconds=2)
    for i in range(5):  # later ones, in the same page
        producer.publish(TOPIC, {"later": i}, delay_seconds=3600)
    (written,) = [o.last_modified for o in pq.store.list(layout.delayed_prefix(TOPIC)).objects
                  if mid in o.key]
    assert written is not None
    due = written + timedelta(seconds=2 + (1 if written.microsecond == 0 else 0))
    *idle_polls, (delivering, probe) = _polls_until(pq, store, mid)
    assert idle_polls, "delivered at once"
    for calls, listing in idle_polls:
        assert calls == [f"list {TOPIC}/"], calls
        assert listing.server_time is not None and listing.server_time < due
    assert delivering[0] == f"list {TOPIC}/" and not [c for c in delivering if "get" in c
                                                      and "/delayed/" in c], delivering
    assert probe.server_time is not None and probe.server_time >= due  # due: promoted
    left = pq.store.list(layout.delayed_prefix(TOPIC)).objects
    assert len(left) == 5 and all(mid not in o.key for o in left)


# -- pages cut: on the memory store under a manual clock ---------------------------------

START = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def _queue(clock: FakeClock, ops: Counter[str]) -> PawnQueue:
    def hook(op: str, key: str) -> None:
        ops[f"{op} {key.split('/')[1] if '/' in key else key}"] += 1

    return memory_queue({"polling": {"interval_seconds": 1.0}}, topics=[TOPIC], clock=clock,
                        hooks=hook)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_pages_cut_by_many_delayed_keys_or_leases_lose_and_repeat_nothing(
    clock: FakeClock, packed: bool
) -> None:
    """More future delayed keys than a page (the page is cut inside delayed/: the poll
    lists messages/ too), then more leases than a page with a delayed message due and
    plain ones published: everything delivered once, the delayed one not early; and a
    backlog of due delayed messages longer than a page all delivered once."""
    ops: Counter[str] = Counter()
    with _queue(clock, ops) as pq:
        if packed:
            pq.create_topic(TOPIC, packed=True)
        producer = pq.register_producer("p")
        for i in range(idle.PAGE + 20):
            producer.publish(TOPIC, {"far": i}, delay_seconds=86400 + i)
        consumer = pq.register_consumer("c", [TOPIC])
        seen: Counter[str] = Counter()

        def drain() -> None:
            for _ in range(10):
                for msg in consumer.poll():
                    seen[msg.id] += 1
                    msg.ack()
                clock.advance(0.5)

        ops.clear()
        assert consumer.poll() == []
        assert ops["list "] == 1 and ops["list messages"] == 1, ops  # cut: messages/ too
        plain = set(producer.publish_batch(TOPIC, [{"now": i} for i in range(3)]))
        drain()
        assert set(seen) == plain and set(seen.values()) == {1}
        # leases of nobody's messages fill the page between delayed/ and messages/
        for i in range(idle.PAGE + 20):
            pq.store.put(layout.lease_key(TOPIC, f"00000000-0000-4000-8000-{i:012d}"), b"{}")
        soon = producer.publish(TOPIC, {"soon": 1}, delay_seconds=3)
        more = set(producer.publish_batch(TOPIC, [{"more": i} for i in range(3)]))
        clock.advance(2.9)
        for msg in consumer.poll():
            seen[msg.id] += 1
            msg.ack()
        assert soon not in seen  # not early
        clock.advance(0.2)
        drain()
        assert set(seen) == plain | more | {soon} and set(seen.values()) == {1}
        # a backlog of due delayed messages longer than a page
        backlog = {producer.publish(TOPIC, {"b": i}, delay_seconds=1)
                   for i in range(idle.PAGE + 50)}
        clock.advance(1.5)
        for _ in range(10):
            drain()
            if backlog <= set(seen):
                break
        assert backlog <= set(seen) and set(seen.values()) == {1}
        left = pq.store.list(layout.delayed_prefix(TOPIC)).objects
        assert len(left) == idle.PAGE + 20  # only the far ones


def test_a_cut_page_of_delayed_keys_near_due_lists_delayed_at_most_once_an_interval(
    clock: FakeClock
) -> None:
    """More delayed keys than a page, all within the promotion's horizon but none due:
    idle polls in a tight loop read the page each time, but the pass that lists
    delayed/ beyond it runs at most once a poll interval (as before the idle LIST); once
    due, each is delivered once."""
    ops: Counter[str] = Counter()
    with _queue(clock, ops) as pq:
        producer = pq.register_producer("p")
        ids = {producer.publish(TOPIC, {"n": i}, delay_seconds=60)
               for i in range(idle.PAGE + 20)}
        consumer = pq.register_consumer("c", [TOPIC])
        ops.clear()
        for _ in range(8):
            assert consumer.poll() == []
            clock.advance(0.25)  # 2 s in all: passes at 0 and 1 s
        assert ops["list "] == 8 and ops["list delayed"] == 2, ops
        clock.advance(60)
        seen: Counter[str] = Counter()
        for _ in range(20):
            for msg in consumer.poll():
                seen[msg.id] += 1
                msg.ack()
            clock.advance(0.5)
        assert set(seen) == ids and set(seen.values()) == {1}
