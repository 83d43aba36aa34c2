"""Packed topics, the publishing side: the manifest and topic kind, group commit of
``publish()`` into segments, ``publish_batch`` cutting full segments, limits and
failures; on MemoryStore and on SeaweedFS."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import attrs
import pytest

from pawn_queue_sync import PawnQueue, layout
from pawn_queue_sync.cli import main
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.config import load_config
from pawn_queue_sync.errors import ObjectNotFound, PayloadError, PublishError, StorageError
from pawn_queue_sync.packing import decode_segment
from pawn_queue_sync.queue.batcher import RECENT_SECONDS, new_ids
from pawn_queue_sync.queue.context import PACKED_RECHECK_SECONDS, Context
from pawn_queue_sync.queue.topics import PACKED_FORMAT, PACKED_VERSION
from pawn_queue_sync.storage.memory import MemoryStore
from tests.forking import in_child
from tests.store_helpers import JOIN_TIMEOUT
from tests.threads import wait_until

TOPIC = "events"


def memory_queue(
    publishing: dict[str, Any] | None = None, store: MemoryStore | None = None, **kw: Any
) -> PawnQueue:
    cfg = load_config({"publishing": publishing or {}}, env={})
    return PawnQueue(cfg, store=store or MemoryStore(), **kw).setup()


@pytest.fixture(params=["memory", "seaweedfs"])
def make_queue(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of started queues over one store: MemoryStore, or a SeaweedFS bucket."""
    opened: list[PawnQueue] = []
    store = MemoryStore() if request.param == "memory" else None
    base = {} if store is not None else request.getfixturevalue("real_s3_config")

    def make(publishing: dict[str, Any] | None = None) -> PawnQueue:
        cfg = load_config({**base, "publishing": publishing or {}}, env={})
        pq = PawnQueue(cfg, store=store).setup()
        opened.append(pq)
        return pq

    yield make
    for pq in opened:
        pq.teardown()


# --------------------------------------------------------------------------- topic kind


def test_create_topic_packed_writes_the_manifest_once(make_queue: Any) -> None:
    pq = make_queue()
    assert pq.create_topic(TOPIC, packed=True) is True
    key = layout.packed_manifest_key(TOPIC)
    first = pq.store.get(key)
    manifest = json.loads(first.body)
    assert manifest["format"] == PACKED_FORMAT and manifest["version"] == PACKED_VERSION
    assert set(manifest) == {"format", "version", "created_at"}
    assert first.body == layout.canonical_json(manifest)
    assert pq.context.topic_packed(TOPIC) is True
    # again, from another client: not created, the manifest is left as it was
    other = make_queue()
    assert other.create_topic(TOPIC, packed=True) is False
    assert other.store.get(key).etag == first.etag
    assert other.context.topic_packed(TOPIC) is True


def test_packed_on_a_plain_topic_switches_it(make_queue: Any) -> None:
    pq = make_queue()
    assert pq.create_topic(TOPIC) is True
    assert pq.context.topic_packed(TOPIC) is False
    with pytest.raises(ObjectNotFound):
        pq.store.head(layout.packed_manifest_key(TOPIC))
    assert pq.create_topic(TOPIC, packed=True) is False  # the topic existed
    assert pq.context.topic_packed(TOPIC) is True
    pq.store.head(layout.packed_manifest_key(TOPIC))


def test_the_manifest_is_written_once_without_if_none_match() -> None:
    """Where the server lacks If-None-Match: HEAD, then PUT only if missing."""
    store = MemoryStore()
    pq = memory_queue(store=store)
    pq.context.caps = attrs.evolve(pq.context.caps, if_none_match=False)
    assert pq.create_topic(TOPIC, packed=True) is True
    etag = store.head(layout.packed_manifest_key(TOPIC)).etag
    assert pq.create_topic(TOPIC, packed=True) is False
    assert store.head(layout.packed_manifest_key(TOPIC)).etag == etag


def test_topic_packed_is_cached_false_for_a_while_true_for_good() -> None:
    store = MemoryStore()
    clock = FakeClock()
    reader = memory_queue(store=store, clock=clock)
    writer = memory_queue(store=store)
    writer.create_topic(TOPIC)
    heads: list[str] = []
    real_head = store.head

    def counting_head(key: str) -> Any:
        heads.append(key)
        return real_head(key)

    store.head = counting_head  # type: ignore[method-assign]
    manifest = layout.packed_manifest_key(TOPIC)
    assert reader.context.topic_packed(TOPIC) is False
    writer.create_topic(TOPIC, packed=True)  # switched by another process
    assert reader.context.topic_packed(TOPIC) is False  # still cached as plain
    assert heads.count(manifest) == 1
    clock.advance(PACKED_RECHECK_SECONDS)
    assert reader.context.topic_packed(TOPIC) is True  # looked again
    assert heads.count(manifest) == 2
    clock.advance(10 * PACKED_RECHECK_SECONDS)
    assert reader.context.topic_packed(TOPIC) is True
    assert heads.count(manifest) == 2  # a packed topic stays packed: never asked again


def test_threads_starting_together_look_up_the_manifest_once() -> None:
    """Many threads publishing to a topic at once in a fresh process send one HEAD of
    its manifest, not one each (64 threads sent 46 before: the benchmark's producer)."""
    store = MemoryStore()
    pq = memory_queue(store=store)
    pq.create_topic(TOPIC, packed=True)
    fresh = memory_queue(store=store)
    heads: list[str] = []
    in_head, release = threading.Event(), threading.Event()
    real_head = store.head

    def slow_head(key: str) -> Any:
        heads.append(key)
        in_head.set()
        assert release.wait(JOIN_TIMEOUT)
        return real_head(key)

    store.head = slow_head  # type: ignore[method-assign]
    answers: list[bool] = []
    threads = [threading.Thread(target=lambda: answers.append(
        fresh.context.topic_packed(TOPIC))) for _ in range(16)]
    threads[0].start()
    assert in_head.wait(JOIN_TIMEOUT)
    for t in threads[1:]:
        t.start()
    # Without one lookup at a time, the others' HEADs arrive at once; give them a
    # bounded chance to (the answer does not depend on how long this is).
    with contextlib.suppress(AssertionError):
        wait_until(lambda: len(heads) > 1, "a second HEAD", timeout=0.5)
    release.set()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert answers == [True] * 16
    assert heads == [layout.packed_manifest_key(TOPIC)]


def test_a_failed_recheck_keeps_the_plain_answer() -> None:
    """A plain topic's manifest is looked up again every 30 s: if that HEAD fails, the
    answer we had stands (publishing goes on) instead of failing the publish."""
    clock = FakeClock()
    store = FailingHeads(MemoryStore())
    pq = memory_queue(store=store, clock=clock)  # type: ignore[arg-type]
    pq.create_topic(TOPIC)
    producer = pq.register_producer("p")
    store.failing = True
    with pytest.raises(StorageError):  # no answer yet: the error is the caller's
        pq.context.topic_packed(TOPIC)
    store.failing = False
    producer.publish(TOPIC, 1)
    clock.advance(PACKED_RECHECK_SECONDS)
    store.failing = True
    producer.publish(TOPIC, 2)
    assert store.failed == [layout.packed_manifest_key(TOPIC)] * 2
    assert len(store.list(layout.messages_prefix(TOPIC)).objects) == 2


class FailingHeads:
    """A store whose HEADs of a packed manifest raise StorageError while ``failing``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.failing = False
        self.failed: list[str] = []

    def head(self, key: str) -> Any:
        if self.failing and key.endswith("/.packed"):
            self.failed.append(key)
            raise StorageError("injected failure", key=key)
        return self._inner.head(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_cli_creates_packed_topics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"local:\n  path: {tmp_path / 'store'}\n")
    assert main(["--config", str(cfg), "topics", "--create", "a", "b", "--packed"]) == 0
    assert main(["--config", str(cfg), "topics", "--create", "c"]) == 0
    out = capsys.readouterr().out
    assert "a: created (packed)" in out and "b: created (packed)" in out
    assert "c: created" in out and "c: created (packed)" not in out
    # an existing plain topic made packed says so; an already packed one says it exists
    assert main(["--config", str(cfg), "topics", "--create", "d"]) == 0
    assert main(["--config", str(cfg), "topics", "--create", "d", "a", "--packed"]) == 0
    out = capsys.readouterr().out
    assert "d: exists, switched to packed" in out and "a: exists (packed)" in out
    assert main(["--config", str(cfg), "topics", "--packed"]) == 2
    assert "--packed goes with --create" in capsys.readouterr().err
    with PawnQueue(load_config({"local": {"path": str(tmp_path / "store")}}, env={})) as pq:
        packed = {t: pq.context.topic_packed(t) for t in ("a", "b", "c")}
    assert packed == {"a": True, "b": True, "c": False}


# --------------------------------------------------------------------------- helpers


def segments_of(store: Any, topic: str = TOPIC) -> list[tuple[str, dict[str, Any], list[Any]]]:
    """Every segment in the store, by key: (key, header, decoded messages)."""
    out = []
    for obj in store.list(layout.segments_prefix(topic)).objects:
        parsed = layout.parse_segment_key(topic, obj.key)
        assert parsed is not None, obj.key
        body = store.get(obj.key).body
        docs = decode_segment(body, topic, parsed[0])
        assert len(docs) == parsed[1], "the count in the key is the segment's"
        out.append((obj.key, json.loads(body.split(b"\n", 1)[0]), docs))
    return sorted(out, key=lambda seg: seg[0])


class FailingPuts:
    """A store whose segment PUTs raise StorageError while ``failing`` and ``when(key)``
    holds (else pass on); ``attempts`` and ``failed`` record the segment keys."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.failing = True
        self.attempts: list[str] = []
        self.failed: list[str] = []
        self.when: Callable[[str], bool] = lambda key: True

    def put(self, key: str, body: bytes, **kw: Any) -> Any:
        if "/segments/" in key:
            self.attempts.append(key)
            if self.failing and self.when(key):
                self.failed.append(key)
                raise StorageError("injected failure", key=key)
        return self._inner.put(key, body, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def started(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` on a thread; its result or exception lands in the returned list."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


# --------------------------------------------------------------------------- publish()


def test_threads_publish_every_message_once_in_publish_order(make_queue: Any) -> None:
    """8 threads x 40 publishes: every returned id is in exactly one segment, none
    holds more than the limit, and reading the segments in key order gives each
    thread's messages in the order it published."""
    pq = make_queue({"max_segment_messages": 6})
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("threads")
    threads, per_thread = 8, 40
    returned: dict[int, list[str]] = {t: [] for t in range(threads)}
    barrier = threading.Barrier(threads)

    def run(t: int) -> None:
        barrier.wait()
        for j in range(per_thread):
            returned[t].append(producer.publish(TOPIC, {"t": t, "j": j, "pad": "é" * j}))

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(JOIN_TIMEOUT)
        assert not th.is_alive()
    segs = segments_of(pq.store)
    stored = [doc for _, _, docs in segs for doc in docs]
    all_ids = [mid for ids in returned.values() for mid in ids]
    assert sorted(d["id"] for d in stored) == sorted(all_ids)
    assert len(set(all_ids)) == threads * per_thread
    # (how many share a segment depends on the scheduling: the FakeClock tests below
    # show when a batch seals)
    assert all(1 <= len(docs) <= 6 for _, _, docs in segs)
    for t in range(threads):
        mine = [d for d in stored if d["payload"]["t"] == t]
        assert [d["payload"]["j"] for d in mine] == list(range(per_thread))
        assert [d["id"] for d in mine] == returned[t]
    for _, header, docs in segs:
        assert header["producer_id"] == producer.id and header["topic"] == TOPIC
        assert {d["producer_id"] for d in docs} == {producer.id}
        assert all(d["created_at"] <= header["created_at"] for d in docs)


def test_a_plain_topic_still_gets_one_object_per_message(make_queue: Any) -> None:
    pq = make_queue({"linger_ms": 10000})
    pq.create_topic("plain")
    producer = pq.register_producer("p")
    ids = [producer.publish("plain", n) for n in range(3)]
    ids += producer.publish_batch("plain", [3, 4])
    keys = [o.key for o in pq.store.list("plain/").objects]
    assert sorted(layout.parse_message_key("plain", k) or k for k in keys) == sorted(
        [*ids, "plain/.topic"]
    )


def test_a_lone_publish_does_not_wait_for_the_linger() -> None:
    """On a manual FakeClock time never moves by itself: a publish that waited for its
    10 s linger would never return."""
    clock = FakeClock()
    pq = memory_queue({"linger_ms": 10000}, clock=clock)
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("lone")
    for n in range(3):
        thread, box = started(lambda n=n: producer.publish(TOPIC, n))
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive() and isinstance(box[0], str)
    assert [len(docs) for _, _, docs in segments_of(pq.store)] == [1, 1, 1]


def _two_publishers(linger_ms: int) -> tuple[PawnQueue, FakeClock, Any]:
    clock = FakeClock()
    pq = memory_queue({"linger_ms": linger_ms}, clock=clock)
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("two")
    producer.publish(TOPIC, "first")  # by this thread, alone: at once
    return pq, clock, producer


def open_batch_size(producer: Any) -> int:
    """How many messages wait in the producer's open batch (white box: which of the
    threads started joined it is not visible otherwise)."""
    batch = next(iter(producer._batchers.values()))._open
    return 0 if batch is None else len(batch.lines)


def test_a_batch_waits_for_the_other_recent_publisher_then_seals_when_it_joins() -> None:
    pq, clock, producer = _two_publishers(10000)
    # another thread publishes while the first thread's publish is recent: it waits
    waiter, box = started(lambda: producer.publish(TOPIC, "second"))
    wait_until(lambda: clock.waiting() == 1, "the second publish to linger")
    assert not box
    # the first thread publishes again: everyone recent is in the batch, sealed
    producer.publish(TOPIC, "third")
    waiter.join(JOIN_TIMEOUT)
    assert isinstance(box[0], str)
    counts = [[d["payload"] for d in docs] for _, _, docs in segments_of(pq.store)]
    assert counts == [["first"], ["second", "third"]]


def test_a_batch_is_sealed_at_its_linger() -> None:
    pq, clock, producer = _two_publishers(20)
    waiter, box = started(lambda: producer.publish(TOPIC, "second"))
    wait_until(lambda: clock.waiting() == 1, "the second publish to linger")
    clock.advance(0.019)
    assert not box  # not yet (the first thread is recent for 100 ms)
    clock.advance(0.001)
    waiter.join(JOIN_TIMEOUT)
    assert isinstance(box[0], str)
    assert [len(docs) for _, _, docs in segments_of(pq.store)] == [1, 1]


def test_a_batch_stops_waiting_for_a_publisher_that_went_quiet() -> None:
    pq, clock, producer = _two_publishers(10000)
    waiter, box = started(lambda: producer.publish(TOPIC, "second"))
    wait_until(lambda: clock.waiting() == 1, "the second publish to linger")
    clock.advance(RECENT_SECONDS / 2)
    assert not box
    clock.advance(RECENT_SECONDS / 2)  # the first thread is no longer a recent publisher
    waiter.join(JOIN_TIMEOUT)
    assert isinstance(box[0], str)
    assert [[d["payload"] for d in docs] for _, _, docs in segments_of(pq.store)] == [
        ["first"],
        ["second"],
    ]


def test_a_failed_segment_fails_every_caller_of_it() -> None:
    """Three callers share one segment whose PUT fails: each gets PublishError, and
    nothing of it is stored; the next segment goes through."""
    pq, clock, producer = _two_publishers(10000)
    store = FailingPuts(pq.store)
    pq.context.store = store
    # this thread published recently: the others' batch waits for it
    runs = [started(lambda n=n: producer.publish(TOPIC, f"doomed {n}")) for n in range(3)]
    wait_until(lambda: open_batch_size(producer) == 3, "three publishes in one batch")
    assert clock.waiting() == 1 and not store.attempts
    clock.advance(RECENT_SECONDS)  # this thread went quiet: sealed, written, failed
    for thread, _ in runs:
        thread.join(JOIN_TIMEOUT)
    results = [box[0] for _, box in runs]
    assert all(isinstance(r, PublishError) for r in results), results
    assert all("injected failure" in str(r) for r in results)
    assert len(store.failed) == 1 and store.failed[0].endswith("-n3.seg")
    stored = [d["payload"] for _, _, docs in segments_of(pq.store) for d in docs]
    assert stored == ["first"]
    store.failing = False
    assert isinstance(producer.publish(TOPIC, "after"), str)
    assert len(segments_of(pq.store)) == 2


def test_failing_puts_fail_every_threaded_publish(make_queue: Any) -> None:
    pq = make_queue()
    pq.create_topic(TOPIC, packed=True)
    store = FailingPuts(pq.store)
    pq.context.store = store
    producer = pq.register_producer("f")
    runs = [started(lambda n=n: producer.publish(TOPIC, n)) for n in range(6)]
    for thread, _ in runs:
        thread.join(JOIN_TIMEOUT)
    assert all(isinstance(box[0], PublishError) for _, box in runs)
    assert sum(layout.parse_segment_key(TOPIC, k)[1] for k in store.failed) == 6  # type: ignore[index]
    assert segments_of(pq.store) == []


def test_publish_checks_its_payload_and_message_id(make_queue: Any) -> None:
    pq = make_queue({"max_payload_bytes": 500, "max_segment_bytes": 4596})
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("limits")
    with pytest.raises(PayloadError, match="max_payload_bytes"):
        producer.publish(TOPIC, "x" * 500)
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        producer.publish(TOPIC, {"bad": object()})
    with pytest.raises(PayloadError, match="not a UUID"):
        producer.publish(TOPIC, 1, message_id="nope")
    assert segments_of(pq.store) == []


def test_a_deterministic_id_and_time_are_kept_on_a_packed_topic(make_queue: Any) -> None:
    pq = make_queue()
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("det")
    mid = str(uuid.UUID(int=42))
    when = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)
    assert producer.publish(TOPIC, "a", message_id=mid.upper(), created_at=when) == mid
    assert producer.publish(TOPIC, "a", message_id=mid, created_at=when) == mid
    segs = segments_of(pq.store)
    assert len(segs) == 2, "re-publishing writes another segment (no overwrite)"
    assert {(d["id"], d["created_at"]) for _, _, docs in segs for d in docs} == {
        (mid, layout.iso(when))
    }


def test_segments_are_cut_by_bytes(make_queue: Any) -> None:
    """Segments stay within max_segment_bytes (header included) yet hold several
    messages: with 10,000 bytes, about 1,950-byte lines go four to a segment."""
    limit = 10000
    pq = make_queue({"max_payload_bytes": 2000, "max_segment_bytes": limit})
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("bytes")
    ids = producer.publish_batch(TOPIC, ["y" * 1800] * 9 + ["z" * 10])
    runs = [started(lambda n=n: producer.publish(TOPIC, "w" * 1800)) for n in range(6)]
    for thread, box in runs:
        thread.join(JOIN_TIMEOUT)
        ids.append(box[0])
    segs = segments_of(pq.store)
    assert sorted(d["id"] for _, _, docs in segs for d in docs) == sorted(ids)
    sizes = [len(pq.store.get(key).body) for key, _, _ in segs]
    assert max(sizes) <= limit
    # the batch: 4 + 4 + 1 + the small one (a fifth big line would not fit)
    assert [len(docs) for _, _, docs in segs[:3]] == [4, 4, 2]


# --------------------------------------------------------------------------- publish_batch


def test_publish_batch_writes_full_segments_in_input_order(make_queue: Any) -> None:
    pq = make_queue()  # max_segment_messages: 1000 by default
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("batch")
    ids = producer.publish_batch(TOPIC, [{"n": n} for n in range(2500)])
    segs = segments_of(pq.store)
    assert [len(docs) for _, _, docs in segs] == [1000, 1000, 500]
    stored = [d for _, _, docs in segs for d in docs]
    assert [d["payload"]["n"] for d in stored] == list(range(2500))
    assert [d["id"] for d in stored] == ids
    assert len(set(ids)) == 2500
    assert producer.publish_batch(TOPIC, []) == []


def test_a_bad_payload_in_a_batch_publishes_nothing(make_queue: Any) -> None:
    pq = make_queue({"max_payload_bytes": 500, "max_segment_bytes": 4596})
    pq.create_topic(TOPIC, packed=True)
    producer = pq.register_producer("bad")
    with pytest.raises(PayloadError, match="payload #3"):
        producer.publish_batch(TOPIC, [1, 2, 3, {"x": {1, 2}}, 5])
    with pytest.raises(PayloadError, match=r"payload #1: .*max_payload_bytes"):
        producer.publish_batch(TOPIC, [1, "x" * 600])
    assert segments_of(pq.store) == []


def test_a_failed_segment_of_a_batch_fails_its_messages_only() -> None:
    pq = memory_queue({"max_segment_messages": 4})
    pq.create_topic(TOPIC, packed=True)
    store = FailingPuts(pq.store)
    store.when = lambda key: len(store.attempts) == 2  # the second segment's PUT
    pq.context.store = store
    producer = pq.register_producer("partial")
    with pytest.raises(PublishError) as info:
        producer.publish_batch(TOPIC, list(range(10)), threads=1)  # 4 + 4 + 2, in order
    err = info.value
    assert err.failed_indices == [4, 5, 6, 7]  # type: ignore[attr-defined]
    stored = [d for _, _, docs in segments_of(pq.store) for d in docs]
    assert [d["payload"] for d in stored] == [0, 1, 2, 3, 8, 9]
    assert err.published_ids == [d["id"] for d in stored]  # type: ignore[attr-defined]
    assert "4 of 10 messages" in str(err) and "injected failure" in str(err)


def test_a_forked_child_never_joins_its_parents_open_batch() -> None:
    """A batch lingers in the parent when it forks; its opener thread does not exist in
    the child, so a child joining it would wait forever for a write nobody makes. The
    child publishes through a batcher of its own; the parent's batch is unaffected."""
    pq, clock, producer = _two_publishers(10000)
    waiter, box = started(lambda: producer.publish(TOPIC, "parent"))
    wait_until(lambda: open_batch_size(producer) == 1 and clock.waiting() == 1, "a linger")

    def child() -> int:
        producer.publish(TOPIC, "child")
        payloads = [d["payload"] for _, _, docs in segments_of(pq.store) for d in docs]
        return 0 if payloads == ["first", "child"] else 3

    assert in_child(child) == 0
    assert not box
    producer.publish(TOPIC, "parent too")  # this thread joins: everyone is in, sealed
    waiter.join(JOIN_TIMEOUT)
    assert isinstance(box[0], str)
    assert [[d["payload"] for d in docs] for _, _, docs in segments_of(pq.store)] == [
        ["first"],
        ["parent", "parent too"],
    ]


def test_new_ids_are_random_version_4_uuids() -> None:
    ids = new_ids(2000)
    assert len(set(ids)) == 2000
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
    # every hex digit shows up at every random position (none is stuck)
    for pos in (0, 9, 15, 20, 35):
        assert len({text[pos] for text in ids}) == 16
    assert {text[14] for text in ids} == {"4"}  # the version
    assert {text[19] for text in ids} == set("89ab")  # the variant
    assert new_ids(0) == []


def test_segments_of_a_batch_sort_in_input_order_however_their_puts_interleave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The PUTs of a batch's segments run in parallel, in any order; their keys (the
    order consumers take them in) still follow the input: the times are taken in order
    before the PUTs start. Here the pool runs the PUTs last submitted first."""
    pq = memory_queue({"max_segment_messages": 5})
    pq.create_topic(TOPIC, packed=True)
    pool = ReversingPool()
    monkeypatch.setattr(Context, "pool", lambda self, name, workers: pool)
    producer = pq.register_producer("order")
    ids = producer.publish_batch(TOPIC, list(range(50)))
    assert pool.ran == 10
    stored = [d for _, _, docs in segments_of(pq.store) for d in docs]
    assert [d["payload"] for d in stored] == list(range(50))
    assert [d["id"] for d in stored] == ids


class ReversingPool:
    """An executor that runs what it was given, last first, when a result is asked."""

    def __init__(self) -> None:
        self.pending: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self.ran = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut = _LazyFuture(self)
        self.pending.append((fut, fn, args))
        return fut

    def run_all(self) -> None:
        pending, self.pending = self.pending, []
        for fut, fn, args in reversed(pending):
            self.ran += 1
            try:
                fut.set_result(fn(*args))
            except Exception as exc:
                fut.set_exception(exc)


class _LazyFuture(Future[Any]):
    def __init__(self, pool: ReversingPool) -> None:
        super().__init__()
        self._pool = pool

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._pool.run_all()
        return super().exception(timeout)
