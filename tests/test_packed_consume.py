"""Packed topics, the consuming side (queue.packed): every message delivered exactly
once by threads, a listener and processes; crashes and takeovers carry the recorded
progress (acked never again, unacked again with one more delivery, dead-lettered
after max_delivery_count deliveries across holders); nack, retry, release, a lost
segment lease, a corrupt segment, single messages in a packed topic, giving segments
back. On MemoryStore (a clock the test can move) and on SeaweedFS with both lease
strategies."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pawn_queue_sync import LeaseLostError, PawnQueue, StorageError, layout, packing
from pawn_queue_sync.config import load_config
from pawn_queue_sync.protocol.lease import Capabilities
from pawn_queue_sync.protocol.segments import SegmentLease
from pawn_queue_sync.queue import held
from pawn_queue_sync.queue.held import HeldSegment
from pawn_queue_sync.queue.message import Message
from pawn_queue_sync.storage.memory import MemoryStore
from tests.servers import deep_merge
from tests.short_leases import POLLING
from tests.test_consumer_regressions import CSPRNG_FAST, JumpClock
from tests.test_lease_seaweedfs import STRATEGIES

TOPIC = "events"
#: A wait that runs out fails the test; it never hangs.
DEADLINE = 60.0
#: past the visibility timeout and its grace by the server's clock: stale for certain
STALE = POLLING["visibility_timeout_seconds"] + 2.5
#: memory-no-if-match: a server honouring neither If-None-Match nor If-Match (csprng
#: claims, every lease write check-write-confirm)
BACKENDS = ["memory", "memory-no-if-match", *(f"seaweedfs-{s}" for s in STRATEGIES)]
NO_CONDITIONS = {"concurrency": {"strategy": "csprng_verify", "csprng_verify": CSPRNG_FAST}}


def publish_segments(pq: PawnQueue, payloads: Sequence[Any], per: int,
                     topic: str = TOPIC) -> list[list[str]]:
    """Write ``payloads`` as segments of ``per`` messages (oldest first, as a producer
    would); the ids of each segment's messages."""
    ctx = pq.context
    segments = []
    for start in range(0, len(payloads), per):
        sid, now = str(uuid.uuid4()), ctx.next_timestamp()
        ids, lines = [], []
        for payload in payloads[start : start + per]:
            ids.append(str(uuid.uuid4()))
            lines.append(packing.encode_line(ids[-1], "p", layout.iso(now), payload))
        key = layout.segment_key(topic, layout.sortable_timestamp(now), sid, len(lines))
        ctx.store.put(key, packing.encode_segment(topic, sid, "p", layout.iso(now), lines))
        segments.append(ids)
    return segments


def keys(pq: PawnQueue, prefix: str) -> list[str]:
    return [o.key for o in pq.store.list(prefix).objects]


def leftovers(pq: PawnQueue) -> list[str]:
    """What remains of the topic's messages: segments, their leases, single messages."""
    return [*keys(pq, layout.segments_prefix(TOPIC)),
            *keys(pq, layout.segment_leases_prefix(TOPIC)),
            *keys(pq, layout.messages_prefix(TOPIC)), *keys(pq, layout.leases_prefix(TOPIC))]


def lease_of(pq: PawnQueue, msg: Message) -> SegmentLease:
    return SegmentLease.decode(pq.store.get(msg.lease_key).body)


class Site:
    """Queues over one store: MemoryStore on a JumpClock, or a SeaweedFS bucket with a
    lease strategy."""

    def __init__(self, backend: str, request: pytest.FixtureRequest) -> None:
        self.backend = backend
        self.clock = JumpClock()
        self.memory = MemoryStore(self.clock) if backend.startswith("memory") else None
        base: dict[str, Any] = NO_CONDITIONS if backend == "memory-no-if-match" else {}
        if self.memory is None:
            base = deep_merge(request.getfixturevalue("real_s3_config"),
                              STRATEGIES[backend.split("-", 1)[1]])
        self.base = base
        self.opened: list[PawnQueue] = []

    def config(self, **polling: Any) -> dict[str, Any]:
        return deep_merge(self.base, {"polling": {"interval_seconds": 0.1, **polling}})

    def queue(self, **polling: Any) -> PawnQueue:
        if self.memory is not None:
            pq = PawnQueue(load_config(self.config(**polling)), store=self.memory,
                           clock=self.clock).setup()
            if self.backend == "memory-no-if-match":
                pq.context.caps = Capabilities(if_none_match=False, if_match=False)
        else:
            pq = PawnQueue(load_config(self.config(**polling))).setup()
        self.opened.append(pq)
        pq.create_topic(TOPIC, packed=True)
        return pq

    def go_stale(self) -> None:
        """Let every lease written so far go stale by the server's clock."""
        if self.memory is not None:
            self.clock.jump(STALE)
        else:
            time.sleep(STALE)


@pytest.fixture(params=BACKENDS)
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    site = Site(request.param, request)
    yield site
    for pq in site.opened:
        pq.teardown()


def drain_all(consumer: Any, until: float = DEADLINE) -> list[Message]:
    """Poll and ack until a poll comes back empty."""
    got: list[Message] = []
    end = time.monotonic() + until
    while time.monotonic() < end:
        batch = consumer.poll()
        if not batch:
            return got
        got.extend(batch)
        consumer.ack_many(batch)
    raise AssertionError("still polling at the deadline")


# -- exactly once -------------------------------------------------------------------------


def test_three_consumers_in_threads_get_every_message_once(site: Site) -> None:
    pq = site.queue(max_messages_per_poll=7)
    segs = publish_segments(pq, list(range(240)), 40) + publish_segments(pq, [240, 241], 1)
    ids = {mid for seg in segs for mid in seg}
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            got = drain_all(pq.register_consumer(name, [TOPIC]))
            with lock:
                seen.update(m.id for m in got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"c{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert not errors
    # a consumer may stop while another still holds segments: the rest is drained here
    seen.update(m.id for m in drain_all(pq.register_consumer("last", [TOPIC])))
    assert set(seen) == ids and max(seen.values()) == 1
    assert leftovers(pq) == []


def test_listen_with_eight_workers_handles_every_message_once(site: Site) -> None:
    pq = site.queue()
    segs = publish_segments(pq, [{"n": n} for n in range(500)], 100)
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(msg: Message) -> None:
        with lock:
            seen[msg.id] += 1

    pq.register_consumer("c", [TOPIC]).listen(handler, max_workers=8,
                                              idle_timeout_seconds=1.0)
    assert set(seen) == {m for s in segs for m in s} and max(seen.values()) == 1
    assert leftovers(pq) == []


def _consume_in_process(config: dict[str, Any], barrier: Any, results: Any, i: int) -> None:
    delivered: list[str] = []
    error = ""
    try:
        with PawnQueue.from_config(config) as pq:
            consumer = pq.register_consumer(f"proc-{i}", [TOPIC])
            barrier.wait(timeout=60)
            end = time.monotonic() + DEADLINE
            while time.monotonic() < end:
                batch = consumer.poll()
                delivered.extend(m.id for m in batch)
                consumer.ack_many(batch)
                if not batch and not leftovers(pq):
                    break
            else:
                error = "deadline passed with messages left"
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    results.put((i, delivered, error))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_processes_consume_a_packed_topic_once(real_s3_config: dict[str, Any],
                                                   strategy: str) -> None:
    config = deep_merge(real_s3_config, {**STRATEGIES[strategy],
                                         "polling": {"interval_seconds": 0.1}})
    with PawnQueue.from_config(config) as pq:
        pq.create_topic(TOPIC, packed=True)
        segs = publish_segments(pq, list(range(300)), 25)
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(2), spawn.Queue()
    procs = [spawn.Process(target=_consume_in_process, args=(config, barrier, results, i))
             for i in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=DEADLINE + 60) for _ in procs]
    for p in procs:
        p.join(30)
    assert [e for _, _, e in got] == ["", ""]
    seen = Counter(mid for _, ids, _ in got for mid in ids)
    assert set(seen) == {m for s in segs for m in s} and max(seen.values()) == 1


# -- crashes and takeovers ------------------------------------------------------------------


def test_a_takeover_carries_progress(site: Site) -> None:
    """A crashed holder's acks stay acked; what it had out comes back once its lease is
    stale, one delivery more; what it never handed out comes back first-time."""
    pq = site.queue(**POLLING)
    publish_segments(pq, list(range(10)), 10)
    a = pq.register_consumer("a", [TOPIC])
    first = a.poll(4)
    assert [m.payload for m in first] == [0, 1, 2, 3]
    assert [m.delivery_count for m in first] == [1] * 4
    a.ack_many(first[:2])  # a "crashes" holding 2 and 3
    b = pq.register_consumer("b", [TOPIC])
    assert b.poll() == []  # a's lease is live
    site.go_stale()
    got = b.poll(10)
    assert [m.payload for m in got] == list(range(2, 10))
    assert [m.delivery_count for m in got] == [2, 2] + [1] * 6
    assert lease_of(pq, got[0]).consumer_id == b.id
    b.ack_many(got)
    with pytest.raises(LeaseLostError):
        a.ack(first[2])  # its segment lease was taken over
    assert first[2].state == "lost"
    assert leftovers(pq) == []


def test_max_delivery_count_holds_across_takeovers(site: Site) -> None:
    """Each holder crashes with the message out: after max_delivery_count (3)
    deliveries the next taker dead-letters it instead of handing it out."""
    pq = site.queue(**POLLING)
    (ids,) = publish_segments(pq, [{"kills": "its process"}, "fine"], 2)
    counts = []
    for i in range(3):
        got = pq.register_consumer(f"c{i}", [TOPIC]).poll(1)
        assert [m.payload for m in got] == [{"kills": "its process"}]
        counts.append(got[0].delivery_count)
        site.go_stale()
    assert counts == [1, 2, 3]
    last = pq.register_consumer("c3", [TOPIC])
    got = last.poll()
    assert [m.payload for m in got] == ["fine"]
    last.ack_many(got)
    dl = json.loads(pq.store.get(layout.dead_letter_key(TOPIC, ids[0])).body)
    assert dl["payload"] == {"kills": "its process"} and dl["id"] == ids[0]
    assert dl["dead_letter"]["delivery_count"] == 3
    assert "delivered 3 times without an ack" in dl["dead_letter"]["reason"]
    assert leftovers(pq) == []


def test_a_consumer_closed_gives_its_segments_back_at_once(site: Site) -> None:
    pq = site.queue()
    publish_segments(pq, list(range(20)), 20)
    a = pq.register_consumer("a", [TOPIC])
    got = a.poll(5)
    a.ack_many(got)
    a.close()
    lease = SegmentLease.decode(pq.store.get(got[0].lease_key).body)
    assert lease.released and lease.progress.unsettled() == list(range(5, 20))
    assert lease.progress.deliveries_of(5) == 0  # counted ahead, given back uncounted
    b = pq.register_consumer("b", [TOPIC])
    rest = drain_all(b)  # no wait for a visibility timeout
    assert [m.payload for m in rest] == list(range(5, 20))
    assert [m.delivery_count for m in rest] == [1] * 15


# -- settlement -----------------------------------------------------------------------------


def test_nack_writes_the_dead_letter_and_settles(site: Site) -> None:
    pq = site.queue()
    (ids,) = publish_segments(pq, [{"bad": True}, {"ok": 1}], 2)
    c = pq.register_consumer("c", [TOPIC])
    bad, ok = c.poll()
    bad.nack("cannot parse")
    assert bad.state == "nacked"
    assert lease_of(pq, ok).progress.settled == ((0, 1),)
    dl = json.loads(pq.store.get(layout.dead_letter_key(TOPIC, ids[0])).body)
    assert dl["payload"] == {"bad": True} and dl["topic"] == TOPIC
    assert dl["dead_letter"]["reason"] == "cannot parse"
    ok.ack()
    assert drain_all(c) == [] and leftovers(pq) == []


def test_retry_and_release_give_the_message_back(site: Site) -> None:
    pq = site.queue(max_delivery_count=3)
    publish_segments(pq, ["x", "y"], 2)
    c = pq.register_consumer("c", [TOPIC])
    x, y = c.poll()
    c.retry(x, "boom")
    c.release(y)
    assert (x.state, y.state) == ("released", "released")
    progress = lease_of(pq, x).progress
    assert progress.error_of(0) == "boom"
    assert (progress.deliveries_of(0), progress.deliveries_of(1)) == (1, 0)
    x2, y2 = c.poll()
    assert (x2.payload, x2.delivery_count) == ("x", 2)
    assert (y2.payload, y2.delivery_count) == ("y", 1)
    c.retry(x2, "boom again")
    (x3,) = c.poll()
    assert x3.delivery_count == 3
    c.retry(x3)
    assert c.poll() == []  # the fourth would pass max_delivery_count: dead-lettered
    dl = json.loads(pq.store.get(layout.dead_letter_key(TOPIC, x.id)).body)
    assert "last error: boom again" in dl["dead_letter"]["reason"]
    y2.ack()
    assert leftovers(pq) == []


def test_refresh_keeps_a_segment_and_is_coalesced(site: Site) -> None:
    # renewed when older than half the refresh interval: 1 s here
    pq = site.queue(visibility_timeout_seconds=6, lease_refresh_interval_seconds=2)
    publish_segments(pq, list(range(3)), 3)
    c = pq.register_consumer("c", [TOPIC])
    msgs = c.poll()
    c.refresh(msgs[0])  # (a csprng_verify claim may have aged past half an interval)
    token = msgs[0].segment.token
    for msg in msgs:  # fresh now: nothing to write
        c.refresh(msg)
    assert msgs[0].segment.token == token
    site.clock.jump(1.1) if site.memory is not None else time.sleep(1.1)
    c.refresh(msgs[0])
    assert msgs[0].segment.token != token
    c.refresh(msgs[1])
    assert msgs[1].lease_token == msgs[0].lease_token  # one write for both
    b = pq.register_consumer("b", [TOPIC])
    assert b.poll() == []
    c.ack_many(msgs)
    assert leftovers(pq) == []


# -- what else a packed topic holds -----------------------------------------------------------


def test_a_corrupt_segment_is_quarantined_and_the_poll_goes_on(site: Site) -> None:
    pq = site.queue()
    publish_segments(pq, [1, 2], 2)
    sid = str(uuid.uuid4())
    bad = layout.segment_key(TOPIC, "20000101T000000_000000", sid, 3)  # the oldest
    pq.store.put(bad, b'{"not": "a segment"}\n')
    pq.store.put(f"{TOPIC}/segments/README.txt", b"hello")
    c = pq.register_consumer("c", [TOPIC])
    got = drain_all(c)
    assert sorted(m.payload for m in got) == [1, 2]
    reasons = {}
    for key in keys(pq, layout.dead_letter_prefix(TOPIC)):
        doc = json.loads(pq.store.get(key).body)
        reasons[doc["dead_letter"]["original_key"]] = doc["dead_letter"]["reason"]
    assert "corrupt segment" in reasons[bad]
    assert "foreign" in reasons[f"{TOPIC}/segments/README.txt"]
    assert leftovers(pq) == []


def test_single_messages_in_a_packed_topic_are_consumed(site: Site) -> None:
    pq = site.queue()
    pq.create_topic("plain")
    producer = pq.register_producer("p")
    # a single message object, as pawn-queue (or this library before the switch) wrote it
    ctx = pq.context
    mid, now = str(uuid.uuid4()), ctx.next_timestamp()
    doc = {"id": mid, "topic": TOPIC, "producer_id": None, "created_at": layout.iso(now),
           "payload": "single"}
    pq.store.put(layout.message_key(TOPIC, layout.sortable_timestamp(now), mid),
                 layout.canonical_json(doc))
    publish_segments(pq, ["packed"], 1)
    producer.publish("plain", "untouched")
    c = pq.register_consumer("c", [TOPIC])
    got = drain_all(c)
    assert sorted(m.payload for m in got) == ["packed", "single"]
    assert {m.segment is None for m in got} == {True, False}
    assert leftovers(pq) == []


def test_a_lost_segment_lease_makes_its_messages_lost(site: Site) -> None:
    pq = site.queue(**POLLING)
    publish_segments(pq, list(range(4)), 4)
    a = pq.register_consumer("a", [TOPIC])
    held = a.poll(2)
    site.go_stale()
    b = pq.register_consumer("b", [TOPIC])
    taken = b.poll()
    assert [m.payload for m in taken] == [0, 1, 2, 3]
    with pytest.raises(LeaseLostError):
        a.ack_many(held)
    assert {m.state for m in held} == {"lost"}
    with pytest.raises(LeaseLostError):
        held[0].nack("late")
    assert not keys(pq, layout.dead_letter_prefix(TOPIC))
    b.ack_many(taken)
    assert leftovers(pq) == []


# -- the group commit, on MemoryStore ---------------------------------------------------------


class Faults:
    """A MemoryStore hook on segment lease writes: counts them, and can hold or fail
    the next ones."""

    def __init__(self) -> None:
        self.writes = 0
        self.hold: threading.Event | None = None
        self.held = threading.Event()
        self.fail = 0

    def __call__(self, op: str, key: str) -> None:
        if op != "put" or "/segment-leases/" not in key:
            return
        self.writes += 1
        if self.fail:
            self.fail -= 1
            raise StorageError("injected", key=key)
        if self.hold is not None:
            self.held.set()
            assert self.hold.wait(DEADLINE)


def faulty_queue(clock: JumpClock | None = None, **polling: Any) -> tuple[PawnQueue, Faults]:
    faults = Faults()
    clock = clock or JumpClock()
    cfg = load_config({"polling": {"interval_seconds": 0.1, **polling}}, env={})
    pq = PawnQueue(cfg, store=MemoryStore(clock, hooks=faults), clock=clock).setup()
    pq.create_topic(TOPIC, packed=True)
    return pq, faults


def test_acks_arriving_during_a_write_share_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine threads ack one message each while the first one's write is held: the
    eight others are carried by one more write, and each returns only once a write
    containing its ack has completed."""
    pq, faults = faulty_queue()
    publish_segments(pq, list(range(10)), 10)
    c = pq.register_consumer("c", [TOPIC])
    msgs = c.poll(10)
    changes = threading.Semaphore(0)
    change = HeldSegment.change

    def counted(self: HeldSegment, fn: Any) -> int:
        version = change(self, fn)
        changes.release()
        return version

    monkeypatch.setattr(HeldSegment, "change", counted)
    faults.writes, faults.hold = 0, threading.Event()
    threads = [threading.Thread(target=m.ack) for m in msgs[:9]]
    threads[0].start()
    assert faults.held.wait(DEADLINE)  # the first write is on its way
    for t in threads[1:]:
        t.start()
    for _ in range(9):
        assert changes.acquire(timeout=DEADLINE)  # every ack's change is made
    assert [m.state for m in msgs[1:9]] == ["leased"] * 8  # none reported yet
    faults.hold.set()
    for t in threads:
        t.join(DEADLINE)
    assert faults.writes == 2
    assert [m.state for m in msgs[:9]] == ["acked"] * 9
    assert lease_of(pq, msgs[9]).progress.settled == ((0, 9),)
    msgs[9].ack()
    assert leftovers(pq) == []


def test_an_ack_batch_costs_one_lease_write_per_segment() -> None:
    pq, faults = faulty_queue(max_messages_per_poll=20)
    publish_segments(pq, list(range(20)), 10)
    c = pq.register_consumer("c", [TOPIC])
    msgs = c.poll(20)
    assert len({id(m.segment) for m in msgs}) == 2
    faults.writes = 0
    c.ack_many(msgs[:5] + msgs[10:15])
    assert faults.writes == 2
    c.ack_many(msgs[5:10] + msgs[15:])
    # completing both: deleted at once within the time fence, with no lease write
    assert faults.writes == 2 and leftovers(pq) == []


def test_an_ack_completing_a_segment_past_its_fence_records_first() -> None:
    clock = JumpClock()
    pq, faults = faulty_queue(clock, **POLLING)
    publish_segments(pq, ["a", "b"], 2)
    c = pq.register_consumer("c", [TOPIC])
    msgs = c.poll()
    clock.jump(POLLING["visibility_timeout_seconds"] - 1.5)  # past the fence, not stale
    faults.writes = 0
    c.ack_many(msgs)
    assert faults.writes == 1  # proven ours by the write that records the acks
    assert [m.state for m in msgs] == ["acked", "acked"] and leftovers(pq) == []


def test_a_failed_lease_write_leaves_the_ack_to_do_again() -> None:
    pq, faults = faulty_queue()
    publish_segments(pq, ["a", "b"], 2)
    c = pq.register_consumer("c", [TOPIC])
    a, b = c.poll()
    faults.fail = 1
    with pytest.raises(StorageError):
        a.ack()
    assert a.state == "leased"
    a.ack()
    assert a.state == "acked"
    assert lease_of(pq, b).progress.settled == ((0, 1),)
    b.ack()
    assert leftovers(pq) == []


def test_a_hand_out_not_recorded_is_not_handed_out_nor_counted() -> None:
    pq, faults = faulty_queue()
    publish_segments(pq, ["a", "b", "c"], 3)
    c = pq.register_consumer("c", [TOPIC])
    (a,) = c.poll(1)
    faults.fail = 1
    with pytest.raises(StorageError):
        c.poll(1)  # the next reservation could not be written
    (b,) = c.poll(1)
    assert (b.payload, b.delivery_count) == ("b", 1)
    assert lease_of(pq, b).progress.deliveries_of(1) == 1
    c.ack_many([a, b, *c.poll()])
    assert leftovers(pq) == []


def test_a_settlement_waiting_while_its_segment_is_finished_is_not_lost() -> None:
    """An ack that completes a segment deletes it at once; a settlement of another
    message whose write was still waiting then has nothing left to write (it was
    a LeaseLostError: its write met the deleted lease)."""
    pq, faults = faulty_queue()
    publish_segments(pq, ["a", "b"], 2)
    c = pq.register_consumer("c", [TOPIC])
    a, b = c.poll()
    seg = a.segment
    version = seg.change(lambda p: p.settle([a.index]))  # a's nack got this far
    faults.writes = 0
    b.ack()  # completes the segment (a's change included): deleted at once
    seg.commit(version)  # a's write, late: carried by the deletion
    assert faults.writes == 0 and not seg.lost
    assert leftovers(pq) == []


def test_a_poll_takes_as_many_small_segments_as_it_wants() -> None:
    """Segments handed out whole take no place among the held ones (it was at most
    polling.max_segments_held, 4, per poll: one-message segments went four at a time)."""
    pq, _ = faulty_queue(max_segments_held=2)
    publish_segments(pq, list(range(12)), 1)
    publish_segments(pq, list(range(12, 32)), 10)
    c = pq.register_consumer("c", [TOPIC])
    first = c.poll(10)
    assert [m.payload for m in first] == list(range(10))
    second = c.poll(10)  # two singles, then 8 of a 10-message segment (held)
    assert [m.payload for m in second] == list(range(10, 20))
    assert len({id(m.segment) for m in second}) == 3
    third = c.poll(20)  # the held one's last two, then the next segment
    assert [m.payload for m in third] == list(range(20, 32))
    c.ack_many(first + second + third)
    assert leftovers(pq) == []


def test_a_busy_consumer_claims_small_segments_reserved_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Polls following each other reserve more (doubling, as a held segment's
    reservations): the claims of one poll spread that reservation over several small
    segments (up to polling.max_segments_held), so later polls hand their messages out
    with no lease write besides the claims. Each claim reserved only the poll's want
    before: a second write per segment, 24 for 12 segments."""
    monkeypatch.setattr(held, "_RESERVE_GROWS_WITHIN_S", 3600.0)  # however slow the machine
    pq, faults = faulty_queue(max_segments_held=4)
    publish_segments(pq, list(range(48)), 4)
    c = pq.register_consumer("c", [TOPIC])
    got: list[Message] = []
    for _ in range(24):
        got.extend(c.poll(2))
    assert [m.payload for m in got] == list(range(48))
    assert [m.delivery_count for m in got] == [1] * 48
    assert faults.writes == 13  # the 12 claims, and the first segment's second half
    assert c.poll(2) == []
    c.ack_many(got)
    assert leftovers(pq) == []


def test_a_consumer_alone_reuses_its_lease_listing_and_loses_only_a_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer alone on a topic judges segments by its last listing of their leases
    for up to a second (one LIST a claim round, not two). A rival it has not heard of
    yet (registered after it last read the registry) takes a segment meanwhile: the
    lone consumer's claim of it fails (a conditional write), nothing is delivered
    twice, and its next round lists the leases again."""
    monkeypatch.setattr(held, "_RESERVE_GROWS_WITHIN_S", 3600.0)
    pq, _ = faulty_queue()
    publish_segments(pq, list(range(6)), 2)
    listings: Counter[str] = Counter()
    listed = pq.store.list

    def counted(prefix: str, **kw: Any) -> Any:
        listings[prefix] += 1
        return listed(prefix, **kw)

    monkeypatch.setattr(pq.store, "list", counted)
    lease_lists = layout.segment_leases_prefix(TOPIC)
    a = pq.register_consumer("a", [TOPIC])
    first = a.poll(2)  # the first segment; registry read: a is alone
    b = pq.register_consumer("b", [TOPIC])
    theirs = b.poll(2)  # b knows of a: lists the leases, takes one of the two left
    before = listings[lease_lists]
    second = a.poll(4)  # reuses its listing: claims both, wins one
    assert listings[lease_lists] == before
    assert len(second) == 2
    got = [m.payload for m in first + second + theirs]
    assert sorted(got) == list(range(6))  # each message once
    assert a.poll(2) == [] and listings[lease_lists] == before + 1  # contended: lists
    a.ack_many(first + second)
    b.ack_many(theirs)
    assert leftovers(pq) == []


def test_what_the_producer_publishes_is_consumed_once(site: Site) -> None:
    """publish() from threads (group-committed into segments) and publish_batch."""
    pq = site.queue()
    producer = pq.register_producer("p")
    ids = list(producer.publish_batch(TOPIC, [{"b": n} for n in range(150)]))
    lock = threading.Lock()

    def publish(k: int) -> None:
        for n in range(10):
            mid = producer.publish(TOPIC, {"t": k, "n": n})
            with lock:
                ids.append(mid)

    threads = [threading.Thread(target=publish, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert keys(pq, layout.segments_prefix(TOPIC)) and not keys(pq, layout.messages_prefix(TOPIC))
    seen: Counter[str] = Counter()
    pq.register_consumer("c", [TOPIC]).listen(lambda m: seen.update([m.id]), max_workers=8,
                                              idle_timeout_seconds=1.0)
    assert set(seen) == set(ids) and len(ids) == 190 and max(seen.values()) == 1
    assert leftovers(pq) == []
