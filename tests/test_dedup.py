"""Deduplicated publishing (issue 16): ``publish(..., dedup_id=K)`` on SeaweedFS and the
local store, plain and packed topics, counting messages exactly: threads and processes
racing on one id, the window, a write that failed or a writer that died between its
marker and its message, bad ids, the janitor's expiry of markers, the CLI."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, PayloadError, PublishError, StorageError, layout
from pawn_queue_sync.config import load_config
from pawn_queue_sync.errors import ConditionFailed, ConfigError
from pawn_queue_sync.queue import dedup
from pawn_queue_sync.storage.factory import build_store
from pawn_queue_sync.testing import memory_queue
from tests.interop import run_pawnqueue
from tests.servers import deep_merge
from tests.test_cli import _pawnq
from tests.test_deadletters import TOPIC, Wrapped, config, drain  # noqa: F401 (fixture)
from tests.test_interop import _CONSUME_AND_READ

THREADS = 8
PROCESSES = 4
#: A process still working after this long is stuck: the test fails, never hangs.
DEADLINE_SECONDS = 120.0
KINDS = pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])


def delivered(pq: PawnQueue, topic: str, want: set[str]) -> Counter[str]:
    """Every delivery of ``topic`` by id (acked), until ``want`` came and polls are
    quiet; :func:`drain` fails the test on a second delivery of an id."""
    consumer = pq.register_consumer("counter", [topic])
    try:
        return Counter(list(drain(consumer, want, lambda m: m.ack())))
    finally:
        consumer.close()


def markers(pq: PawnQueue, topic: str) -> list[str]:
    return [o.key for o in pq.store.list(layout.dedup_prefix(topic)).objects]


def marker_doc(pq: PawnQueue, topic: str, dedup_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(pq.store.get(dedup.marker_key(topic, dedup_id)).body)
    return doc


def wait_server_past(pq: PawnQueue, key: str, seconds: float) -> None:
    """Wait until the server's clock is ``seconds`` past ``key``'s LastModified."""
    written = pq.store.head(key).last_modified
    assert written is not None
    end = time.monotonic() + DEADLINE_SECONDS
    while True:
        now = pq.store.server_time()
        assert now is not None
        if (now - written).total_seconds() > seconds:
            return
        assert time.monotonic() < end
        time.sleep(0.1)


# -- races --------------------------------------------------------------------------


@KINDS
def test_threads_racing_on_one_dedup_id_publish_one_message(
    config: dict[str, Any], packed: bool,  # noqa: F811
) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        start = threading.Barrier(THREADS)
        ids: list[str] = []
        errors: list[BaseException] = []

        def publish(i: int) -> None:
            try:
                start.wait(timeout=30)
                ids.append(producer.publish(TOPIC, {"from": i}, dedup_id="order-17"))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_SECONDS)
        assert not errors and len(ids) == THREADS
        assert len(set(ids)) == 1, Counter(ids)
        got = delivered(pq, TOPIC, set(ids))
        assert got == Counter({ids[0]: 1})
        assert marker_doc(pq, TOPIC, "order-17")["state"] == "written"


def _publish_in_process(cfg: dict[str, Any], barrier: Any, results: Any, index: int) -> None:
    """Publish the shared dedup id once, behind the barrier; report the id or the error."""
    try:
        with PawnQueue.from_config(cfg) as pq:
            producer = pq.register_producer(f"p{index}")
            pq.context.topic_packed(TOPIC)  # looked up before the race, as a warm producer
            barrier.wait(timeout=60)
            results.put((index, producer.publish(TOPIC, {"from": index},
                                                 dedup_id="invoice-9"), ""))
    except BaseException as exc:  # report it: an exception in a child is otherwise lost
        results.put((index, "", f"{type(exc).__name__}: {exc}"))


@KINDS
def test_processes_racing_on_one_dedup_id_publish_one_message(
    config: dict[str, Any], packed: bool,  # noqa: F811
) -> None:
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC, packed=packed)
    mp = multiprocessing.get_context("spawn")
    barrier = mp.Barrier(PROCESSES)
    results = mp.Queue()
    procs = [mp.Process(target=_publish_in_process,
                        args=(config, barrier, results, i), daemon=True)
             for i in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=DEADLINE_SECONDS) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [err for _, _, err in reports if err] == []
    ids = {mid for _, mid, _ in reports}
    assert len(ids) == 1, reports
    with PawnQueue(config) as pq:
        assert delivered(pq, TOPIC, ids) == Counter({ids.pop(): 1})


# -- the window -----------------------------------------------------------------------


@KINDS
def test_after_the_window_a_new_message_is_published_and_the_janitor_expires_markers(
    config: dict[str, Any], packed: bool,  # noqa: F811
) -> None:
    window = 2.0
    with PawnQueue(deep_merge(config, {"publishing": {"dedup_window_seconds": window}})
                   ) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        first = producer.publish(TOPIC, {"n": 1}, dedup_id="k")
        assert producer.publish(TOPIC, {"n": 2}, dedup_id="k") == first
        key = dedup.marker_key(TOPIC, "k")
        wait_server_past(pq, key, window)
        second = producer.publish(TOPIC, {"n": 3}, dedup_id="k")
        assert second != first
        assert delivered(pq, TOPIC, {first, second}) == Counter({first: 1, second: 1})
        # the janitor: the marker of "k" is young again (just replaced), "old" expires
        producer.publish(TOPIC, {"n": 4}, dedup_id="old")
        old = dedup.marker_key(TOPIC, "old")
        wait_server_past(pq, old, window + dedup.EXPIRE_GRACE_SECONDS)
        producer.publish(TOPIC, {"n": 5}, dedup_id="young")
        consumer = pq.register_consumer("janitor", [TOPIC])
        consumer.janitor(TOPIC)
        left = markers(pq, TOPIC)
        assert old not in left and dedup.marker_key(TOPIC, "young") in left
        consumer.close()


def test_expiry_is_bounded_per_run_and_carries_on_where_it_stopped() -> None:
    with memory_queue({"publishing": {"dedup_window_seconds": 10}}, topics=[TOPIC]) as pq:
        producer = pq.register_producer("p")
        for i in range(5):
            producer.publish(TOPIC, i, dedup_id=f"id-{i}")
        pq.context.clock.advance(12)  # type: ignore[attr-defined]
        producer.publish(TOPIC, "young", dedup_id="young")
        deleted, cursor = dedup.expire_markers(pq.context, TOPIC, limit=2)
        assert deleted <= 2 and cursor is not None and len(markers(pq, TOPIC)) == 6 - deleted
        janitor = dedup.MarkerJanitor(pq.context)
        for _ in range(4):
            janitor.run(TOPIC)
        assert markers(pq, TOPIC) == [dedup.marker_key(TOPIC, "young")]


def test_polls_expire_markers_once_an_interval() -> None:
    with memory_queue({"publishing": {"dedup_window_seconds": 10}}, topics=[TOPIC]) as pq:
        clock = pq.context.clock
        pq.register_producer("p").publish(TOPIC, 1, dedup_id="k")
        consumer = pq.register_consumer("c", [TOPIC])
        consumer.poll()  # the first poll starts the interval
        clock.advance(dedup.MIN_EXPIRE_INTERVAL_SECONDS - 1)  # type: ignore[attr-defined]
        consumer.poll()
        assert markers(pq, TOPIC) != []  # expired, but no run was due yet
        clock.advance(2)  # type: ignore[attr-defined]
        consumer.poll()
        assert markers(pq, TOPIC) == []


# -- a failed or dead writer ------------------------------------------------------------


def _failing_first_write(store: Wrapped, prefix: str) -> list[str]:
    """Make the first put under ``prefix`` raise (before it is sent); the keys it failed."""
    failed: list[str] = []
    inner_put = store.inner.put

    def put(key: str, body: bytes, **kwargs: Any) -> Any:
        if key.startswith(prefix) and not failed:
            failed.append(key)
            raise StorageError("injected: connection reset", key=key)
        return inner_put(key, body, **kwargs)

    store.inner.put = put  # type: ignore[method-assign]
    return failed


@KINDS
def test_a_retry_after_a_failed_write_completes_it_with_the_same_id(
    config: dict[str, Any], packed: bool,  # noqa: F811
) -> None:
    cfg = load_config(config)
    store = Wrapped(build_store(cfg))
    with PawnQueue(cfg, store=store) as pq:  # type: ignore[arg-type]
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        body_prefix = (layout.segments_prefix if packed else layout.messages_prefix)(TOPIC)
        failed = _failing_first_write(store, body_prefix)
        with pytest.raises(PublishError):
            producer.publish(TOPIC, {"n": 1}, dedup_id="k")
        assert failed and marker_doc(pq, TOPIC, "k")["state"] == "failed"
        first_id = marker_doc(pq, TOPIC, "k")["message_id"]
        assert producer.publish(TOPIC, {"n": 1}, dedup_id="k") == first_id
        assert producer.publish(TOPIC, {"n": 1}, dedup_id="k") == first_id
        assert delivered(pq, TOPIC, {first_id}) == Counter({first_id: 1})
    store.inner.close()


def test_dedup_and_delay_combine_into_one_delayed_message(
    config: dict[str, Any],  # noqa: F811
) -> None:
    cfg = load_config(config)
    store = Wrapped(build_store(cfg))
    with PawnQueue(cfg, store=store) as pq:  # type: ignore[arg-type]
        pq.create_topic(TOPIC)
        producer = pq.register_producer("p")
        failed = _failing_first_write(store, layout.delayed_prefix(TOPIC))
        with pytest.raises(PublishError):
            producer.publish(TOPIC, {"n": 1}, dedup_id="later", delay_seconds=2)
        assert failed and pq.store.list(layout.delayed_prefix(TOPIC)).objects == []
        ids = {producer.publish(TOPIC, {"n": 1}, dedup_id="later", delay_seconds=2)
               for _ in range(3)}
        assert ids == {marker_doc(pq, TOPIC, "later")["message_id"]}
        assert len(pq.store.list(layout.delayed_prefix(TOPIC)).objects) == 1
        assert delivered(pq, TOPIC, ids) == Counter({ids.pop(): 1})
    store.inner.close()


@pytest.mark.parametrize("wrote", [False, True], ids=["died-before-write",
                                                      "died-after-write"])
def test_a_marker_left_writing_by_a_dead_writer_is_completed_once(
    config: dict[str, Any], wrote: bool, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    monkeypatch.setattr(dedup, "WRITER_DEAD_SECONDS", 2.0)
    with PawnQueue(config) as pq:
        pq.create_topic(TOPIC)
        producer = pq.register_producer("p")
        dead_id = "0b9e3a5c-1d2e-4f60-8a7b-9c0d1e2f3a4b"
        created = pq.context.next_timestamp()
        if wrote:  # the dead writer's message landed before it died
            producer.publish(TOPIC, {"n": "dead"}, message_id=dead_id, created_at=created)
        marker = dedup._Marker("k", dead_id, layout.iso(created), "writing")
        pq.store.put(dedup.marker_key(TOPIC, "k"), marker.encode(), if_none_match=True)
        waiters: list[str] = []
        threads = [threading.Thread(target=lambda: waiters.append(
            producer.publish(TOPIC, {"n": "retry"}, dedup_id="k"))) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_SECONDS)
        assert waiters == [dead_id] * 3
        assert delivered(pq, TOPIC, {dead_id}) == Counter({dead_id: 1})
        assert marker_doc(pq, TOPIC, "k")["state"] == "written"


def test_a_create_whose_answer_was_lost_is_recognised_as_ours() -> None:
    """The create landed but its answer was lost, and the retry got 412: the publish
    must see its own marker and write at once, not wait for a dead writer."""
    with memory_queue(topics=[TOPIC]) as pq:
        store = pq.store
        inner_put = store.put

        def put(key: str, body: bytes, **kwargs: Any) -> Any:
            result = inner_put(key, body, **kwargs)
            if kwargs.get("if_none_match") and key.startswith(layout.dedup_prefix(TOPIC)):
                raise ConditionFailed("the retry of an applied create", key=key)
            return result

        store.put = put  # type: ignore[method-assign]
        started = pq.context.clock.monotonic()
        mid = pq.register_producer("p").publish(TOPIC, 1, dedup_id="k")
        assert pq.context.clock.monotonic() - started < dedup.WRITER_DEAD_SECONDS
        assert delivered(pq, TOPIC, {mid}) == Counter({mid: 1})


def test_a_wait_on_a_writer_that_stays_busy_is_bounded_and_writes_nothing() -> None:
    """A "writing" marker rewritten before every read (a writer alive but never done)
    is never taken over: the publish gives up after WAIT_SECONDS of its clock."""
    state = {"busy": False, "pq": None}
    busy = dedup._Marker("k", "0b9e3a5c-1d2e-4f60-8a7b-9c0d1e2f3a4b",
                         "2026-01-01T00:00:00+00:00", "writing")

    def rewrite_before_get(op: str, key: str) -> None:
        if op == "get" and key.startswith(layout.dedup_prefix(TOPIC)) and not state["busy"]:
            state["busy"] = True
            try:  # a fresh version each time: never unchanged for WRITER_DEAD_SECONDS
                state["pq"].store.put(key, busy.now("writing").encode())  # type: ignore[union-attr]
            finally:
                state["busy"] = False

    with memory_queue(topics=[TOPIC], hooks=rewrite_before_get) as pq:
        state["pq"] = pq
        pq.store.put(dedup.marker_key(TOPIC, "k"), busy.encode())
        started = pq.context.clock.monotonic()
        with pytest.raises(PublishError, match="nothing was written"):
            pq.register_producer("p").publish(TOPIC, 1, dedup_id="k")
        assert pq.context.clock.monotonic() - started >= dedup.WAIT_SECONDS
        assert pq.store.list(layout.messages_prefix(TOPIC)).objects == []


# -- bad input, unsupported servers ----------------------------------------------------


@pytest.mark.parametrize("bad", ["", "x" * 129, "a\nb", "tab\there", "\ud800", 5, True,
                                 b"bytes"])
def test_bad_dedup_ids_are_refused_before_anything_is_written(bad: Any, tmp_path: Path
                                                               ) -> None:
    with PawnQueue({"local": {"path": str(tmp_path / "s")}}) as pq:
        pq.create_topic(TOPIC)
        before = [o.key for o in pq.store.list(f"{TOPIC}/").objects]
        with pytest.raises(PayloadError):
            pq.register_producer("p").publish(TOPIC, {"n": 1}, dedup_id=bad)
        assert [o.key for o in pq.store.list(f"{TOPIC}/").objects] == before


def test_the_longest_id_and_any_printable_text_are_accepted() -> None:
    with memory_queue(topics=[TOPIC]) as pq:
        producer = pq.register_producer("p")
        for good in ("x" * 128, "ünïcødé / ../ 注文 #1", " "):
            assert producer.publish(TOPIC, 1, dedup_id=good) == producer.publish(
                TOPIC, 2, dedup_id=good)


@KINDS
def test_a_refused_payload_writes_no_marker(packed: bool) -> None:
    with memory_queue({"publishing": {"max_payload_bytes": 1000}}) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        for bad in ({"x": object()}, "y" * 2000):
            with pytest.raises(PayloadError):
                producer.publish(TOPIC, bad, dedup_id="k")
        assert markers(pq, TOPIC) == []
        mid = producer.publish(TOPIC, "fine", dedup_id="k")
        assert delivered(pq, TOPIC, {mid}) == Counter({mid: 1})


def test_without_conditional_creates_dedup_is_refused_and_nothing_written(
    tmp_path: Path,
) -> None:
    cfg = {"local": {"path": str(tmp_path / "s")},
           "concurrency": {"strategy": "csprng_verify"}}
    with PawnQueue(cfg) as pq:
        pq.create_topic(TOPIC)
        before = [o.key for o in pq.store.list(f"{TOPIC}/").objects]
        with pytest.raises(PublishError, match="If-None-Match"):
            pq.register_producer("p").publish(TOPIC, 1, dedup_id="k")
        assert [o.key for o in pq.store.list(f"{TOPIC}/").objects] == before


@pytest.mark.parametrize("window", [0, -1, float("inf"), float("nan"), "5", True])
def test_a_bad_window_is_a_config_error(window: Any) -> None:
    with pytest.raises(ConfigError, match=r"publishing\.dedup_window_seconds"):
        load_config({"publishing": {"dedup_window_seconds": window}})
    assert load_config({"publishing": {"dedup_window_seconds": 604800 * 2}}
                       ).publishing.dedup_window_seconds == 1209600.0


# -- the CLI --------------------------------------------------------------------------


def test_pawnq_publish_dedup_id(tmp_path: Path) -> None:
    first = _pawnq(tmp_path, "publish", TOPIC, '{"n": 1}', "--create", "--dedup-id", "k1")
    assert first.returncode == 0, first.stderr
    again = _pawnq(tmp_path, "publish", TOPIC, '{"n": 2}', "--dedup-id", "k1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.split() == first.stdout.split() and len(first.stdout.split()) == 1
    two = _pawnq(tmp_path, "publish", TOPIC, "1", "2", "--dedup-id", "k2")
    assert two.returncode == 2 and "exactly one payload" in two.stderr
    bad = _pawnq(tmp_path, "publish", TOPIC, "1", "--dedup-id", "")
    assert bad.returncode == 2 and "dedup_id" in bad.stderr
    con = _pawnq(tmp_path, "consume", TOPIC, "--max", "5")
    assert [json.loads(x)["payload"] for x in con.stdout.splitlines()] == [{"n": 1}]


# -- cost -----------------------------------------------------------------------------


@KINDS
def test_requests_per_deduplicated_publish_are_as_documented(packed: bool) -> None:
    """docs/operations.md: a first publish costs the marker's create and its mark on
    top of the message's write, and a producer's first deduplicated publish on a topic
    one LIST of its markers (the expiry of old ones); a repeat within the window a
    refused create and a GET, and writes nothing."""
    seen: Counter[tuple[str, str]] = Counter()
    counting = {"on": False}

    def hook(op: str, key: str) -> None:
        if counting["on"]:
            section = key.split("/")[1] if "/" in key else key
            seen[(op, section)] += 1

    with memory_queue(hooks=hook) as pq:
        pq.create_topic(TOPIC, packed=packed)
        producer = pq.register_producer("p")
        producer.publish(TOPIC, 0)  # the topic's lookups, cached from here on
        body = "segments" if packed else "messages"
        counting["on"] = True
        first = producer.publish(TOPIC, 1, dedup_id="k")
        assert seen == Counter({("put", "dedup"): 2, ("put", body): 1, ("list", "dedup"): 1})
        seen.clear()
        assert producer.publish(TOPIC, 2, dedup_id="k") == first
        assert seen == Counter({("put", "dedup"): 1, ("get", "dedup"): 1})


# -- pawn-queue 0.1.3 -----------------------------------------------------------------


@pytest.mark.interop
def test_pawnqueue_consumes_a_deduplicated_message_once_and_ignores_markers(
    real_s3_config: dict[str, Any],
) -> None:
    with PawnQueue(real_s3_config) as pq:
        pq.create_topic("orders")
        producer = pq.register_producer("sync-service")
        ids = {producer.publish("orders", {"order_id": 1}, dedup_id="order-1")
               for _ in range(3)}
        assert len(ids) == 1 and len(markers(pq, "orders")) == 1
        result = run_pawnqueue(
            _CONSUME_AND_READ,
            {**real_s3_config, "concurrency": {"strategy": "conditional_write"}},
            args={"topic": "orders", "consumer": "billing", "producer": "sync-service",
                  "dead_letter_prefix": layout.dead_letter_prefix("orders")},
        )
        first, second = result["polls"]
        assert [m["id"] for m in first] == list(ids) and second == []
        assert [m["payload"] for m in first] == [{"order_id": 1}]
        assert markers(pq, "orders") == [dedup.marker_key("orders", "order-1")]
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 0}


def test_deleting_a_topic_deletes_its_dedup_markers(tmp_path: Path) -> None:
    """No consumer polls a deleted topic, so none would ever expire its markers: the
    delete takes them (and a topic created again under the name starts without)."""
    with PawnQueue({"local": {"path": str(tmp_path / "s")}}) as pq:
        pq.create_topic(TOPIC)
        first = pq.register_producer("p").publish(TOPIC, 1, dedup_id="k")
        consumer = pq.register_consumer("c", [TOPIC])
        for msg in consumer.poll():
            msg.ack()
        consumer.close()
        pq.delete_topic(TOPIC)
        assert pq.store.list(f"{TOPIC}/").objects == []
        pq.create_topic(TOPIC)
        assert pq.register_producer("p").publish(TOPIC, 2, dedup_id="k") != first
