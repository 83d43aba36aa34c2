"""Dead letters (read, redrive, purge), peek and delete_topic, on SeaweedFS and the
local store, counting messages exactly (issue 16, part A)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import (
    InvalidArgument,
    Message,
    PawnQueue,
    StorageError,
    TopicNotEmptyError,
    TopicNotFoundError,
    layout,
)
from pawn_queue_sync.config import load_config
from pawn_queue_sync.protocol.lease import Capabilities
from pawn_queue_sync.queue.consumer import Consumer
from pawn_queue_sync.queue.deadletters import iter_keys
from pawn_queue_sync.storage.base import Store
from pawn_queue_sync.storage.factory import build_store
from tests.servers import deep_merge

TOPIC = "orders"
#: Seconds a test waits for messages it counts before calling them lost.
DEADLINE = 60.0
FAST = {"polling": {"interval_seconds": 0.05}}


class Wrapped:
    """A store that forwards every call, counting them by method, and raises from
    ``delete``/``delete_many`` on keys ``fail_delete`` accepts (a crash between a
    redrive's write and its delete)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.fail_delete: Callable[[str], bool] = lambda _key: False
        #: called with the key after each successful put (a rival acting in between)
        self.after_put: Callable[[str], None] = lambda _key: None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name in ("describe",):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "delete" and self.fail_delete(args[0]):
                raise StorageError("injected: the process died before this delete",
                                   key=args[0])
            if name == "delete_many" and any(self.fail_delete(k) for k in args[0]):
                raise StorageError("injected: the process died before this delete")
            result = attr(*args, **kwargs)
            if name == "put":
                self.after_put(args[0])
            return result

        return call


@pytest.fixture(params=["seaweedfs", "local"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The library configuration of a fresh bucket on SeaweedFS, or a fresh local store."""
    if request.param == "seaweedfs":
        base: dict[str, Any] = request.getfixturevalue("real_s3_config")
    else:
        base = {"local": {"path": str(tmp_path / "store")}}
    return deep_merge(base, FAST)


@pytest.fixture
def wrapped(config: dict[str, Any]) -> Iterator[tuple[PawnQueue, Wrapped]]:
    """A started queue over a :class:`Wrapped` store."""
    cfg = load_config(config)
    store = Wrapped(build_store(cfg))
    pq = PawnQueue(cfg, store=store).setup()  # type: ignore[arg-type]
    try:
        yield pq, store
    finally:
        pq.teardown()
        store.inner.close()


def keys(pq: PawnQueue, prefix: str = "") -> dict[str, str]:
    """Every key under ``prefix`` with its ETag."""
    return {o.key: o.etag for o in pq.store.list(prefix).objects}


def dead_lettered(pq: PawnQueue, topic: str, n: int, packed: bool = False,
                  reason: str = "bad order") -> dict[str, dict[str, Any]]:
    """Publish ``n`` messages and nack each: their documents by id, as published."""
    pq.create_topic(topic, packed=packed)
    ids = pq.register_producer("p").publish_batch(topic, [{"n": i} for i in range(n)])
    consumer = pq.register_consumer("nacker", [topic])
    got = drain(consumer, set(ids), lambda m: m.nack(reason))
    assert sorted(got) == sorted(ids)
    consumer.close()
    return {m: got[m] for m in ids}


def drain(consumer: Consumer, want: set[str], settle: Callable[[Message], None]
          ) -> dict[str, dict[str, Any]]:
    """Poll until every id of ``want`` came (each settled with ``settle``), then poll on
    briefly: each delivery is recorded; a second one of an id fails the test."""
    got: dict[str, dict[str, Any]] = {}
    end = time.monotonic() + DEADLINE
    quiet = 0
    while quiet < 5:
        msgs = consumer.poll(max_messages=50)
        for msg in msgs:
            assert msg.id not in got, f"{msg.id} delivered twice"
            got[msg.id] = {"created_at": msg.created_at, "payload": msg.payload,
                           "delivery_count": msg.delivery_count}
            settle(msg)
        if want <= set(got):
            quiet += 0 if msgs else 1
        assert time.monotonic() < end, f"{len(want - set(got))} of {len(want)} never came"
        if not msgs:
            time.sleep(0.05)
    return got


def in_background(consumer: Consumer, want: set[str]) -> Callable[[], dict[str, Any]]:
    """Start :func:`drain` (acking) of ``want`` on a thread; the returned call joins it
    and gives what it got (raising what it raised)."""
    got: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            got.update(drain(consumer, want, lambda m: m.ack()))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=consume)
    worker.start()

    def join() -> dict[str, Any]:
        worker.join(DEADLINE * 2)
        assert not worker.is_alive(), "the consumer never finished"
        if errors:
            raise errors[0]
        return got

    return join


# -- reading --------------------------------------------------------------------------


def test_dead_letters_list_reasons_and_history(config: dict[str, Any]) -> None:
    with PawnQueue(config) as pq:
        published = dead_lettered(pq, TOPIC, 5)
        letters = list(pq.dead_letters(TOPIC))
        assert sorted(d.id for d in letters if d.id) == sorted(published)
        for d in letters:
            assert d.reason == "bad order" and d.redrivable
            assert d.payload == published[d.id]["payload"]
            assert d.created_at == published[d.id]["created_at"]
            assert d.delivery_count == 1 and d.consumer_id and d.dead_lettered_at
            assert layout.parse_message_key(TOPIC, d.original_key or "") == d.id
        assert len(list(pq.dead_letters(TOPIC, limit=2))) == 2


def test_unreadable_dead_letters_are_yielded_not_raised_and_never_redriven(
    config: dict[str, Any],
) -> None:
    with PawnQueue(config) as pq:
        dead_lettered(pq, TOPIC, 2)
        junk = layout.dead_letter_key(TOPIC, "00000000-0000-4000-8000-000000000000")
        pq.store.put(junk, b"\xff not json")
        letters = {d.key: d for d in pq.dead_letters(TOPIC)}
        assert len(letters) == 3
        assert letters[junk].payload is None and "not JSON" in letters[junk].reason
        result = pq.redrive(TOPIC)
        assert len(result.moved) == 2 and list(result.skipped) == [junk]
        assert list(keys(pq, layout.dead_letter_prefix(TOPIC))) == [junk]


# -- redrive --------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_redrive_puts_each_back_once_with_its_id_and_created_at(
    config: dict[str, Any], packed: bool,
) -> None:
    n = 12
    with PawnQueue(config) as pq:
        published = dead_lettered(pq, TOPIC, n, packed=packed)
        result = pq.redrive(TOPIC)
        assert sorted(result.moved) == sorted(published) and not result.failed
        assert keys(pq, layout.dead_letter_prefix(TOPIC)) == {}
        consumer = pq.register_consumer("again", [TOPIC])
        got = drain(consumer, set(published), lambda m: m.ack())
        assert set(got) == set(published)  # exactly these, each once (drain checks)
        for mid, doc in got.items():
            assert doc["created_at"] == published[mid]["created_at"]
            assert doc["payload"] == published[mid]["payload"]
            assert doc["delivery_count"] == 1  # the count starts again
        assert pq.topic_stats(TOPIC)["pending"] == 0


def test_redrive_max_and_rate(config: dict[str, Any]) -> None:
    with PawnQueue(config) as pq:
        published = dead_lettered(pq, TOPIC, 5)
        seen: list[int] = []
        first = pq.redrive(TOPIC, max=2, rate=1000.0, progress=seen.append)
        assert len(first.moved) == 2 and seen == [1, 2]
        assert len(keys(pq, layout.dead_letter_prefix(TOPIC))) == 3
        rest = pq.redrive(TOPIC)
        assert sorted(first.moved + rest.moved) == sorted(published)


@pytest.mark.parametrize("conditions", [True, False], ids=["conditional", "head-first"])
@pytest.mark.parametrize("consumed_between", [False, True], ids=["rerun", "consumed-then-rerun"])
def test_a_crash_between_write_and_delete_loses_nothing_and_repeats_at_most_once(
    wrapped: tuple[PawnQueue, Wrapped], consumed_between: bool, conditions: bool,
) -> None:
    """The dead letters' deletes fail (the process "died" after each write): every
    dead letter stays, its message is written back. A second redrive finishes: it finds
    the copies still pending (no second one), or, when they were consumed meanwhile,
    writes each again: one repeat each, no more. ``head-first``: as on a server without
    If-None-Match and If-Match (a HEAD before the create and before the delete)."""
    pq, store = wrapped
    published = dead_lettered(pq, TOPIC, 6)
    if not conditions:
        pq.context.caps = Capabilities(if_none_match=False, if_match=False)
    dl_prefix = layout.dead_letter_prefix(TOPIC)
    store.fail_delete = lambda key: key.startswith(dl_prefix)
    crashed = pq.redrive(TOPIC)
    assert crashed.moved == [] and len(crashed.failed) == 6
    assert len(keys(pq, dl_prefix)) == 6  # every dead letter is still there
    assert len(keys(pq, layout.messages_prefix(TOPIC))) == 6  # and written back
    store.fail_delete = lambda _key: False
    consumer = pq.register_consumer("after-crash", [TOPIC])
    if consumed_between:
        assert set(drain(consumer, set(published), lambda m: m.ack())) == set(published)
    again = pq.redrive(TOPIC)
    assert sorted(again.moved) == sorted(published)
    assert keys(pq, dl_prefix) == {}
    assert set(drain(consumer, set(published), lambda m: m.ack())) == set(published)
    assert keys(pq, layout.messages_prefix(TOPIC)) == {}


@pytest.mark.parametrize("conditions", [True, False], ids=["conditional", "head-first"])
def test_a_dead_letter_written_again_during_its_move_stays(
    wrapped: tuple[PawnQueue, Wrapped], conditions: bool,
) -> None:
    """Between the message's write and the dead letter's delete, the message is
    consumed and fails again: its new dead letter (another version of the same key)
    is not deleted by the move."""
    pq, store = wrapped
    (mid,) = dead_lettered(pq, TOPIC, 1)
    if not conditions:
        pq.context.caps = Capabilities(if_none_match=False, if_match=False)
    dl_key = layout.dead_letter_key(TOPIC, mid)
    again = pq.store.get(dl_key).body.replace(b"bad order", b"failed again")

    def failed_again(key: str) -> None:
        if layout.parse_message_key(TOPIC, key) == mid:
            store.after_put = lambda _key: None
            store.inner.put(dl_key, again)

    store.after_put = failed_again
    assert pq.redrive(TOPIC).moved == [mid]
    (letter,) = pq.dead_letters(TOPIC)
    assert letter.reason == "failed again"
    assert [m.id for m in pq.peek(TOPIC)] == [mid]  # and the moved copy is pending


def test_redrive_under_a_concurrent_consumer_loses_nothing(config: dict[str, Any]) -> None:
    with PawnQueue(config) as pq:
        published = dead_lettered(pq, TOPIC, 20)
        fresh = pq.register_producer("p").publish_batch(TOPIC, [{"fresh": i} for i in range(20)])
        join = in_background(pq.register_consumer("busy", [TOPIC]), set(published) | set(fresh))
        result = pq.redrive(TOPIC)
        assert sorted(result.moved) == sorted(published)
        assert set(join()) == set(published) | set(fresh)  # each once (drain checks)
        assert keys(pq, layout.dead_letter_prefix(TOPIC)) == {}


# -- purge ----------------------------------------------------------------------------


def test_purge_dead_letters_under_a_concurrent_consumer(config: dict[str, Any]) -> None:
    with PawnQueue(config) as pq:
        dead_lettered(pq, TOPIC, 15)
        fresh = pq.register_producer("p").publish_batch(TOPIC, [{"fresh": i} for i in range(30)])
        join = in_background(pq.register_consumer("busy", [TOPIC]), set(fresh))
        assert pq.purge(TOPIC) == 15
        assert set(join()) == set(fresh)  # every pending message still handled, once
        assert keys(pq, layout.dead_letter_prefix(TOPIC)) == {}


def test_purge_messages_keeps_leased_ones(config: dict[str, Any]) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC)
        pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(10)])
        consumer = pq.register_consumer("holder", [TOPIC])
        held = consumer.poll(max_messages=3)
        assert len(held) == 3
        assert pq.purge(TOPIC, section="messages") == 7
        left = keys(pq, layout.messages_prefix(TOPIC))
        assert sorted(left) == sorted(m.key for m in held)
        consumer.ack_many(held)  # the holders' acks still work
        assert list(keys(pq, f"{TOPIC}/")) == [layout.topic_marker_key(TOPIC)]


def test_purge_messages_under_a_concurrent_consumer(config: dict[str, Any]) -> None:
    """A consumer handles messages while they are purged: each message is purged or
    handled (both only for one claimed in the instant between the purge's lease
    listing and its delete), none twice, and every ack of the consumer succeeds."""
    n = 60
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC)
        ids = set(pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(n)]))
        consumer = pq.register_consumer("busy", [TOPIC])
        handled: list[str] = []
        errors: list[BaseException] = []
        started = threading.Event()

        def consume() -> None:
            try:
                while batch := consumer.poll(max_messages=5):
                    started.set()
                    time.sleep(0.02)  # handling: leases live while the purge runs
                    consumer.ack_many(batch)
                    handled.extend(m.id for m in batch)
            except BaseException as exc:
                errors.append(exc)
            finally:
                started.set()

        worker = threading.Thread(target=consume)
        worker.start()
        assert started.wait(DEADLINE)
        purged = pq.purge(TOPIC, section="messages")
        worker.join(DEADLINE)
        assert not worker.is_alive() and not errors, errors
        assert len(handled) == len(set(handled)) and set(handled) <= ids
        assert purged + len(handled) >= n  # every message went one way or the other
        assert keys(pq, layout.messages_prefix(TOPIC)) == {}
        assert keys(pq, layout.leases_prefix(TOPIC)) == {}


def test_purge_messages_of_a_packed_topic_counts_segment_messages(
    config: dict[str, Any],
) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC, packed=True)
        pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(25)])
        assert pq.purge(TOPIC, section="messages") == 25
        assert keys(pq, layout.segments_prefix(TOPIC)) == {}
        assert pq.register_consumer("c", [TOPIC]).poll() == []


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda pq: pq.redrive(TOPIC, rate=0),
        lambda pq: pq.redrive(TOPIC, rate=-1.0),
        lambda pq: pq.redrive(TOPIC, rate=float("nan")),
        lambda pq: pq.redrive(TOPIC, rate="fast"),
        lambda pq: pq.redrive(TOPIC, max=0),
        lambda pq: pq.redrive(TOPIC, max=2.5),
        lambda pq: pq.purge(TOPIC, section="everything"),
        lambda pq: pq.peek(TOPIC, n=0),
        lambda pq: pq.dead_letters(TOPIC, limit=-1),  # at the call, not the first item
        lambda pq: pq.delete_topic(TOPIC, force="yes"),
    ],
    ids=["rate0", "rate-1", "rate-nan", "rate-str", "max0", "max-float", "section", "n0",
         "limit-1", "force-str"],
)
def test_bad_input_is_a_typed_error_and_changes_nothing(
    config: dict[str, Any], call: Callable[[PawnQueue], Any],
) -> None:
    with PawnQueue(config) as pq:
        dead_lettered(pq, TOPIC, 2)
        pq.register_producer("p").publish(TOPIC, {"pending": 1})
        before = keys(pq)
        with pytest.raises(InvalidArgument):
            call(pq)
        assert keys(pq) == before


@pytest.mark.parametrize("call", [
    lambda pq: pq.redrive("ghost"), lambda pq: pq.purge("ghost"),
    lambda pq: pq.peek("ghost"), lambda pq: pq.delete_topic("ghost"),
    lambda pq: pq.dead_letters("ghost"),
], ids=["redrive", "purge", "peek", "delete", "dead_letters"])
def test_a_topic_that_does_not_exist_is_topic_not_found(
    config: dict[str, Any], call: Callable[[PawnQueue], Any],
) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC)
        before = keys(pq)
        with pytest.raises(TopicNotFoundError):
            call(pq)
        assert keys(pq) == before


# -- peek ---------------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_peek_reads_without_writing_anything(
    wrapped: tuple[PawnQueue, Wrapped], packed: bool,
) -> None:
    pq, store = wrapped
    dead_lettered(pq, TOPIC, 2, packed=packed)
    ids = pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(6)])
    consumer = pq.register_consumer("c", [TOPIC])
    (held,) = consumer.poll(max_messages=1)
    before = keys(pq)
    store.calls.clear()
    seen = pq.peek(TOPIC, n=10)
    letters = pq.peek(TOPIC, n=10, dead_letter=True)
    assert set(store.calls) <= {"list", "get", "head"}, store.calls
    assert keys(pq) == before
    assert sorted(m.id for m in seen if m.id) == sorted(ids)
    assert [m.leased for m in seen if m.id == held.id] == [True]
    assert sum(m.leased for m in seen) == (6 if packed else 1)  # a segment's lease
    assert len(letters) == 2 and all(d.reason == "bad order" for d in letters)
    assert [m.id for m in pq.peek(TOPIC, n=2)] == [m.id for m in seen[:2]]
    held.ack()
    rest = drain(consumer, set(ids) - {held.id}, lambda m: m.ack())
    assert all(d["delivery_count"] == 1 for d in rest.values())  # peek counted nothing


# -- delete_topic -----------------------------------------------------------------------


def test_delete_topic_refuses_while_anything_remains(config: dict[str, Any]) -> None:
    with PawnQueue(config) as pq:
        dead_lettered(pq, TOPIC, 1)
        before = keys(pq)
        with pytest.raises(TopicNotEmptyError, match="dead letters"):
            pq.delete_topic(TOPIC)
        assert keys(pq) == before
        pq.purge(TOPIC)
        mid = pq.register_producer("p").publish(TOPIC, {"n": 1})
        consumer = pq.register_consumer("c", [TOPIC])
        (msg,) = consumer.poll()
        before = keys(pq)
        with pytest.raises(TopicNotEmptyError, match="messages, live leases"):
            pq.delete_topic(TOPIC)
        assert keys(pq) == before
        msg.ack()
        consumer.close()
        assert pq.delete_topic(TOPIC) >= 1
        assert not pq.topic_exists(TOPIC) and TOPIC not in pq.list_topics()
        assert keys(pq, f"{TOPIC}/") == {}
        assert mid


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_delete_topic_with_force_removes_everything(
    config: dict[str, Any], packed: bool,
) -> None:
    with PawnQueue(config) as pq:
        dead_lettered(pq, TOPIC, 2, packed=packed)
        pq.create_topic("other")
        pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(5)])
        pq.register_producer("p").publish("other", {"keep": 1})
        pq.register_consumer("c", [TOPIC]).poll(max_messages=2)  # leases left live
        other = keys(pq, "other/")
        assert pq.delete_topic(TOPIC, force=True) > 5
        assert keys(pq, f"{TOPIC}/") == {}
        assert keys(pq, "other/") == other
        with pytest.raises(TopicNotFoundError):
            pq.register_producer("p").publish(TOPIC, {"n": 1})
        pq.create_topic(TOPIC)  # created again: plain and empty
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}


def test_listings_are_paged(wrapped: tuple[PawnQueue, Wrapped]) -> None:
    """A topic's objects are read a page at a time (start_after the last key), never
    all at once: 25 keys in pages of 10 are three LISTs, in key order."""
    pq, store = wrapped
    pq.create_topic(TOPIC)
    names = sorted(f"{i:08d}-0000-4000-8000-000000000000" for i in range(25))
    for name in names:
        pq.store.put(layout.dead_letter_key(TOPIC, name), b"{}")
    store.calls.clear()
    got = [o.key for o in iter_keys(pq.context, layout.dead_letter_prefix(TOPIC), page=10)]
    assert got == [layout.dead_letter_key(TOPIC, n) for n in names]
    assert store.calls["list"] == 3
    store.calls.clear()
    assert len(list(iter_keys(pq.context, layout.dead_letter_prefix(TOPIC), limit=12,
                              page=10))) == 12
    assert store.calls["list"] == 2
