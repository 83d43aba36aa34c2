"""The queue through its public API, against real servers and the embedded store.

Every test runs against SeaweedFS and moto (each test on a fresh bucket), and where it
makes sense against the local store too (``backend`` fixture: seaweedfs, moto, local).
Counts and ids are asserted exactly; concurrency is started with barriers, never with
sleeps.
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from pawn_queue_sync import (
    Message,
    NotStartedError,
    PawnQueue,
    PawnQueueError,
    TopicNotFoundError,
    layout,
    load_config,
)
from pawn_queue_sync.queue import planning, registry
from pawn_queue_sync.queue.planning import CONTENDED_WINDOW as _CONTENDED_WINDOW
from pawn_queue_sync.queue.registry import stable_id
from pawn_queue_sync.storage.base import Store
from pawn_queue_sync.storage.factory import build_store
from tests.servers import S3Server, config_dict, deep_merge

#: conftest's session fixture for each S3 server.
S3_FIXTURES = {"seaweedfs": "seaweedfs", "moto": "moto_s3"}

CONDITIONAL = {"concurrency": {"strategy": "conditional_write"}}
CSPRNG = {
    "concurrency": {
        "strategy": "csprng_verify",
        "csprng_verify": {
            "jitter_min_ms": 20,
            "jitter_max_ms": 60,
            "verify_retries": 1,
            "verify_retry_delay_ms": 20,
        },
    }
}
#: csprng_verify with the per-key HEAD protocol (stores whose listings lag)
CSPRNG_PER_KEY = {
    "concurrency": {
        **CSPRNG["concurrency"],
        "csprng_verify": {**CSPRNG["concurrency"]["csprng_verify"], "consistent_list": False},
    }
}
#: A worker thread still busy after this long is stuck: fail, never hang.
DEADLINE = 60.0


@attrs.frozen
class Backend:
    """Where a test's queue lives, and how to configure a queue on it."""

    name: str
    base: dict[str, Any]
    server: S3Server | None = None

    def config(self, **overrides: Any) -> dict[str, Any]:
        return deep_merge(self.base, overrides)

    def queue(self, **overrides: Any) -> PawnQueue:
        return PawnQueue.from_config(self.config(**overrides))


@pytest.fixture(params=["seaweedfs", "moto", "local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A fresh bucket on each S3 server, or a fresh directory for the local store."""
    if request.param == "local":
        yield Backend("local", {"local": {"path": str(tmp_path / "store")}})
        return
    server: S3Server = request.getfixturevalue(S3_FIXTURES[request.param])
    bucket = server.make_bucket("q")
    yield Backend(request.param, config_dict(server, bucket), server)
    if server.name == "seaweedfs":  # one volume per bucket there; moto keeps them in memory
        server.remove_bucket(bucket)


# --------------------------------------------------------------------------- helpers


def keys(pq: PawnQueue, prefix: str = "") -> list[str]:
    """Every key under ``prefix``, as the store lists them."""
    return [o.key for o in pq.store.list(prefix).objects]


def drain(consumer: Any, *, ack: bool = True, max_messages: int | None = None) -> list[Message]:
    """Poll until a poll comes back empty, acking each batch (single consumer only)."""
    out: list[Message] = []
    while batch := consumer.poll(max_messages):
        out.extend(batch)
        if ack:
            consumer.ack_many(batch)
    return out


def run_threads(n: int, work: Callable[[int, threading.Barrier], Any]) -> list[Any]:
    """Run ``work(i, barrier)`` in ``n`` threads; results in index order; errors raised."""
    barrier = threading.Barrier(n, timeout=DEADLINE)
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(work, i, barrier) for i in range(n)]
        return [f.result(timeout=DEADLINE * 2) for f in futures]


# --------------------------------------------------------------------------- quick start


def test_quick_start(backend: Backend, tmp_path: Path) -> None:
    """The README snippet (a YAML file, as there), checked field by field."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(backend.config()))
    with PawnQueue.from_config(config_file) as pq:
        assert pq.create_topic("orders") is True
        assert pq.list_topics() == ["orders"]
        producer = pq.register_producer("order-service")
        before = datetime.now(timezone.utc)
        msg_id = producer.publish("orders", {"order_id": 42})
        batch_ids = producer.publish_batch("orders", [{"order_id": i} for i in range(4)])
        after = datetime.now(timezone.utc)
        consumer = pq.register_consumer("billing", topics=["orders"])
        got = consumer.poll()

        assert [m.id for m in got] == [msg_id, *batch_ids]  # oldest first
        assert [m.payload for m in got] == [{"order_id": 42}] + [{"order_id": i} for i in range(4)]
        assert str(uuid.UUID(msg_id)) == msg_id
        slack = timedelta(seconds=1)
        for msg in got:
            assert msg.topic == "orders"
            assert msg.producer_id == producer.id == stable_id("producers", "order-service")
            created = datetime.fromisoformat(msg.created_at)
            assert created.tzinfo is not None
            assert before - slack <= created <= after + slack
        assert pq.topic_stats("orders") == {"pending": 5, "leased": 5, "dead_letter": 0}

        for msg in got:
            msg.ack()
        assert {msg.state for msg in got} == {"acked"}
        assert consumer.poll() == []
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 0}
        assert keys(pq, "orders/") == ["orders/.topic"]


# --------------------------------------------------------------------------- topics


def test_create_topic_is_idempotent(backend: Backend) -> None:
    with backend.queue() as pq, backend.queue() as other:
        assert pq.create_topic("orders") is True
        assert pq.create_topic("orders") is False
        assert other.create_topic("orders") is False  # another instance, no shared cache
        assert pq.list_topics() == ["orders"]
        assert keys(pq, "orders/") == ["orders/.topic"]
        marker = json.loads(pq.store.get("orders/.topic").body)
        assert marker["topic"] == "orders"

        assert other.create_topic("billing") is True
        other.register_producer("p")  # _registry/ is not a topic
        assert pq.list_topics() == ["billing", "orders"]
        assert other.list_topics() == ["billing", "orders"]
        assert pq.topic_exists("billing") is True
        assert pq.topic_exists("ghost") is False


def test_ghost_topic_raises_topic_not_found(backend: Backend) -> None:
    with backend.queue() as pq:
        pq.create_topic("real")
        producer = pq.register_producer("p")
        with pytest.raises(TopicNotFoundError) as info:
            producer.publish("ghost", {"a": 1})
        assert info.value.topic == "ghost"
        assert "create_topic" in str(info.value)
        with pytest.raises(TopicNotFoundError):
            producer.publish_batch("ghost", [{"a": 1}, {"a": 2}])
        with pytest.raises(TopicNotFoundError):
            pq.register_consumer("c", topics=["ghost"])
        with pytest.raises(TopicNotFoundError):
            pq.register_consumer("c", topics=["real", "ghost"])
        with pytest.raises(TopicNotFoundError):
            pq.topic_stats("ghost")
        assert isinstance(info.value, PawnQueueError)
        assert keys(pq, "ghost") == []
        assert pq.list_topics() == ["real"]

        # once another instance creates it, this one accepts it
        with backend.queue() as other:
            other.create_topic("ghost")
        mid = producer.publish("ghost", {"a": 3})
        assert [m.id for m in drain(pq.register_consumer("c", ["ghost"]))] == [mid]


# --------------------------------------------------------------------------- registration


def test_rank_among_registered_consumers(backend: Backend) -> None:
    """registry.rank: a consumer's place among the registered consumers' ids (producers
    apart), counting itself when it is not registered."""
    with backend.queue() as pq:
        pq.create_topic("t")
        pq.register_producer("p")
        ids = sorted(pq.register_consumer(f"c{i}", ["t"]).id for i in range(3))
        assert [registry.rank(pq.context, "consumers", i) for i in ids] == [
            (0, 3), (1, 3), (2, 3)
        ]
        outsider = str(uuid.UUID(int=2**128 - 1))  # sorts last
        assert registry.rank(pq.context, "consumers", outsider) == (3, 4)


def test_twenty_concurrent_registrations_yield_one_id(backend: Backend) -> None:
    queues = [backend.queue() for _ in range(20)]
    with ThreadPoolExecutor(20) as pool:  # set up in parallel: each builds its own client
        list(pool.map(PawnQueue.setup, queues))
    try:

        def register(i: int, barrier: threading.Barrier) -> str:
            barrier.wait()
            return queues[i].register_producer("order-service").id

        ids = run_threads(20, register)
    finally:
        for pq in queues:
            pq.teardown()

    assert set(ids) == {stable_id("producers", "order-service")}
    with backend.queue() as pq:
        entries = keys(pq, "_registry/")
        assert entries == [layout.registry_key("producers", ids[0])]
        doc = json.loads(pq.store.get(entries[0]).body)
        assert doc["role"] == "producers"
        assert doc["name"] == "order-service"
        assert doc["entity_id"] == ids[0]
        assert {"registered_at", "last_seen"} <= set(doc)
        # and registering again later still gives the same id
        assert pq.register_producer("order-service").id == ids[0]
        pq.create_topic("t")
        assert pq.register_consumer("order-service", ["t"]).id != ids[0]


# --------------------------------------------------------------------------- ordering


def test_fifo_order(backend: Backend) -> None:
    with backend.queue() as pq:
        pq.create_topic("fifo")
        producer = pq.register_producer("p")
        ids = [producer.publish("fifo", {"n": n}) for n in range(30)]
        consumer = pq.register_consumer("c", ["fifo"])
        got = drain(consumer)  # 10 per poll: three polls and an empty one
        assert [m.id for m in got] == ids
        assert [m.payload["n"] for m in got] == list(range(30))
        created = [datetime.fromisoformat(m.created_at) for m in got]
        assert created == sorted(created)
        assert keys(pq, "fifo/messages/") == []


def test_with_a_rival_holding_leases_picks_spread_beyond_the_oldest(backend: Backend) -> None:
    """Consumers polling together would race for the same oldest keys: once a poll
    sees leases that are not its own, it picks at random among _CONTENDED_WINDOW times
    as many candidates (alone, as test_fifo_order shows, strictly oldest first)."""
    window = 4 * _CONTENDED_WINDOW
    with backend.queue() as pq:
        pq.create_topic("spread")
        ids = pq.register_producer("p").publish_batch("spread", [{"n": n} for n in range(200)])
        rival = pq.register_consumer("rival", ["spread"])
        held = rival.poll(2)
        assert [m.id for m in held] == ids[:2]  # alone: the two oldest
        consumer = pq.register_consumer("c", ["spread"])
        picked: set[str] = set()
        for _ in range(5):  # each poll: 4 claims among the `window` oldest free messages
            got = consumer.poll(4)
            assert len(got) == 4
            assert {m.id for m in got} <= set(ids[2:2 + window + len(picked)])
            picked |= {m.id for m in got}
            for msg in got:
                msg.ack()
        # 20 claims: strictly oldest first would be exactly ids[2:22]; 20 random picks
        # among >= 32 candidates land all in the first 20 with probability < 1e-9
        assert picked != set(ids[2:22])
        assert len(picked) == 20
        for msg in held:
            msg.ack()


def test_csprng_batch_claims_among_peers_take_adjacent_ids_from_their_share(
    backend: Backend,
) -> None:
    """With csprng batch claims and other consumers registered, a consumer's first poll
    already spreads: it takes messages adjacent in id order (so its listings span only
    their share of the leases) from its share of the id space by rank among the
    registered consumers; the next poll carries on after the last id taken."""
    with backend.queue(**CSPRNG) as pq:
        pq.create_topic("runs")
        ids = pq.register_producer("p").publish_batch("runs", [{"n": n} for n in range(120)])
        rival = pq.register_consumer("rival", ["runs"])
        held = {m.id for m in rival.poll(2)}
        assert held == set(ids[:2])  # alone when it polled: the oldest
        consumer = pq.register_consumer("c", ["runs"])
        registered = sorted([rival.id, consumer.id])
        last = str(uuid.UUID(int=registered.index(consumer.id) * 2**127))  # its share
        for _ in range(3):
            # the candidates: the oldest free messages, _CONTENDED_WINDOW x 5 of them
            window = sorted([mid for mid in ids if mid not in held][:5 * _CONTENDED_WINDOW])
            got = sorted(m.id for m in consumer.poll(5))
            at = len([mid for mid in window if mid <= last])
            start = min(at, len(window) - 5)  # near the last id: the last five
            assert got == window[start : start + 5]
            # after a run that reached the last id, the next starts from the first
            last = got[-1] if start + 5 < len(window) else ""
            held |= set(got)


# --------------------------------------------------------------------------- fidelity

FIDELITY_PAYLOADS: list[Any] = [
    {
        "text": 'héllo wörld ✓ 日本語 🎉 \u0000 "quoted" \\ back\nslash',
        "nested": {"a": [1, {"b": [None, True, False, []]}], "empty": {}, "deep": [[[[1]]]]},
        "big": 2**64 + 1,
        "negbig": -(10**30),
        "float": 0.1,
        "tiny": 5e-324,
        "huge": 1.7976931348623157e308,
        "negzero": -0.0,
        "int_like_float": 3.0,
    },
    ["a list", 1, 2.5, None],
    "just a string",
    12345678901234567890123,
    None,
]


def test_ack_nack_and_dead_letter_keep_payloads_intact(backend: Backend) -> None:
    with backend.queue() as pq:
        pq.create_topic("fidelity")
        producer = pq.register_producer("p")
        ids = [producer.publish("fidelity", p) for p in FIDELITY_PAYLOADS]
        consumer = pq.register_consumer("c", ["fidelity"])
        got = consumer.poll(len(ids))
        assert [m.id for m in got] == ids
        for msg, payload in zip(got, FIDELITY_PAYLOADS):
            assert msg.payload == payload
            assert json.dumps(msg.payload, sort_keys=True) == json.dumps(payload, sort_keys=True)
        assert got[0].payload["big"] == 2**64 + 1 and isinstance(got[0].payload["big"], int)
        assert isinstance(got[0].payload["int_like_float"], float)

        to_ack, to_nack = got[::2], got[1::2]
        reason = 'bad order ✗ — "rejected"'
        for msg in to_ack:
            msg.ack()
            msg.ack()  # idempotent
        for msg in to_nack:
            msg.nack(reason)
            msg.nack("another reason")  # idempotent: first reason kept
            msg.ack()  # no effect on a nacked message
        assert {m.state for m in to_ack} == {"acked"}
        assert {m.state for m in to_nack} == {"nacked"}

        assert pq.topic_stats("fidelity") == {
            "pending": 0,
            "leased": 0,
            "dead_letter": len(to_nack),
        }
        assert keys(pq, "fidelity/dead-letter/") == sorted(
            layout.dead_letter_key("fidelity", m.id) for m in to_nack
        )
        for msg in to_nack:
            doc = json.loads(pq.store.get(layout.dead_letter_key("fidelity", msg.id)).body)
            assert doc["id"] == msg.id
            assert doc["topic"] == "fidelity"
            assert doc["producer_id"] == producer.id
            assert doc["created_at"] == msg.created_at
            assert doc["payload"] == FIDELITY_PAYLOADS[ids.index(msg.id)]
            assert doc["dead_letter"]["reason"] == reason
            assert doc["dead_letter"]["consumer_id"] == consumer.id
        assert consumer.poll() == []

        # a nack without a reason still records one
        mid = producer.publish("fidelity", {"x": 1})
        (msg,) = consumer.poll()
        msg.nack()
        doc = json.loads(pq.store.get(layout.dead_letter_key("fidelity", mid)).body)
        assert doc["payload"] == {"x": 1}
        assert isinstance(doc["dead_letter"]["reason"], str) and doc["dead_letter"]["reason"]


# --------------------------------------------------------------------------- batches


def test_publish_batch_ids_in_input_order_all_delivered(backend: Backend) -> None:
    with backend.queue() as pq:
        pq.create_topic("batch")
        producer = pq.register_producer("p")
        payloads = [{"i": i, "tag": f"m{i}"} for i in range(25)]
        ids = producer.publish_batch("batch", payloads)
        assert len(ids) == 25
        assert len(set(ids)) == 25
        assert producer.publish_batch("batch", []) == []
        assert pq.topic_stats("batch")["pending"] == 25

        got = drain(pq.register_consumer("c", ["batch"]), max_messages=25)
        by_id = {m.id: m.payload for m in got}
        assert len(got) == 25
        # the id returned at position i is the message carrying payload i
        assert [by_id[mid] for mid in ids] == payloads
        # and keys keep input order, so delivery does too
        assert [m.id for m in got] == ids


# --------------------------------------------------------------------------- concurrency


@pytest.mark.parametrize(
    "strategy", [CONDITIONAL, CSPRNG, CSPRNG_PER_KEY],
    ids=["conditional_write", "csprng", "csprng-per-key"],
)
def test_three_consumers_no_duplicate_no_loss(backend: Backend, strategy: dict[str, Any]) -> None:
    with backend.queue() as pq:
        pq.create_topic("work")
        published = pq.register_producer("p").publish_batch("work", [{"n": n} for n in range(20)])
    wanted = strategy["concurrency"]["strategy"]
    queues = [backend.queue(**strategy) for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(PawnQueue.setup, queues))
    try:
        assert [q.strategy for q in queues] == [wanted] * 3
        if wanted == "csprng_verify":  # batch claims, or the per-key protocol
            batch = strategy is CSPRNG
            assert [q.context.csprng.consistent_list for q in queues] == [batch] * 3

        acked = [0]  # messages acked by all workers together
        changed = threading.Condition()

        def consume(i: int, barrier: threading.Barrier) -> list[str]:
            consumer = queues[i].register_consumer(f"worker-{i}", ["work"])
            seen: list[str] = []
            barrier.wait()
            deadline = time.monotonic() + DEADLINE
            while time.monotonic() < deadline:
                with changed:
                    done = acked[0]
                if done >= len(published):
                    return seen
                batch = consumer.poll(4)
                for msg in batch:
                    seen.append(msg.id)
                    msg.ack()
                with changed:
                    acked[0] += len(batch)
                    changed.notify_all()
                    if not batch:
                        # the rest is leased by the others: wait until they ack some
                        # (the timeout only bounds a wait nobody will end)
                        changed.wait_for(lambda done=done: acked[0] != done, timeout=2.0)
            raise AssertionError(f"worker {i} still busy after {DEADLINE} s")

        per_worker = run_threads(3, consume)
    finally:
        for q in queues:
            q.teardown()

    deliveries = Counter(mid for seen in per_worker for mid in seen)
    assert {mid: n for mid, n in deliveries.items() if n != 1} == {}
    assert set(deliveries) == set(published)
    assert sum(deliveries.values()) == 20
    with backend.queue() as pq:
        assert pq.topic_stats("work") == {"pending": 0, "leased": 0, "dead_letter": 0}


# --------------------------------------------------------------------------- bad objects


def test_malformed_objects_are_dead_lettered_and_the_rest_delivered(backend: Backend) -> None:
    with backend.queue() as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        good = [producer.publish("t", {"good": n}) for n in range(4)]
        # keys that sort before the good ones, so they are in the same listing page
        bad_ids = [str(uuid.uuid4()) for _ in range(4)]
        malformed = {
            layout.message_key("t", "20000101T000000_000001", bad_ids[0]): b"\xff{not json",
            layout.message_key("t", "20000101T000000_000002", bad_ids[1]): json.dumps(
                {"id": bad_ids[1], "topic": "t"}  # no payload
            ).encode(),
            layout.message_key("t", "20000101T000000_000003", bad_ids[2]): b"[1, 2, 3]",
            layout.message_key("t", "20000101T000000_000004", bad_ids[3]): json.dumps(
                {"id": str(uuid.uuid4()), "payload": 1}  # id does not match the key
            ).encode(),
            "t/messages/README.txt": b"not a message at all",
            "t/messages/sub/dir.json": b"{}",
        }
        for key, body in malformed.items():
            pq.store.put(key, body)

        consumer = pq.register_consumer("c", ["t"])
        got = consumer.poll(10)
        # the malformed objects never break the poll: all good messages in one go
        assert [m.id for m in got] == good
        assert [m.payload for m in got] == [{"good": n} for n in range(4)]
        for msg in got:
            msg.ack()
        assert consumer.poll() == []

        stats = pq.topic_stats("t")
        assert stats == {"pending": 0, "leased": 0, "dead_letter": len(malformed)}
        dead = {}
        for key in keys(pq, "t/dead-letter/"):
            doc = json.loads(pq.store.get(key).body)
            dead[doc["dead_letter"]["original_key"]] = doc
        assert set(dead) == set(malformed)
        for key, body in malformed.items():
            info = dead[key]["dead_letter"]
            assert info["reason"]
            # nothing lost: the exact bytes travel with the dead letter
            assert base64.b64decode(info["raw_base64"]) == body
        reasons = {k: v["dead_letter"]["reason"] for k, v in dead.items()}
        assert "foreign" in reasons["t/messages/README.txt"]
        assert "malformed" in reasons[next(iter(malformed))]


# --------------------------------------------------------------------------- requests


class CountingStore:
    """A store wrapper counting (operation, key) pairs; everything else delegates."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in {"put", "get", "head", "delete", "delete_many", "copy", "list"}:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            key = args[0] if args and isinstance(args[0], str) else ""
            with self._lock:
                self.calls[(name, key)] += 1
            return attr(*args, **kwargs)

        return counted

    def count(self, op: str) -> int:
        return sum(n for (o, _), n in self.calls.items() if o == op)


def test_publish_heads_the_topic_marker_once_not_per_message(backend: Backend) -> None:
    with backend.queue() as pq:
        pq.create_topic("t")
    config = load_config(backend.config())
    store = CountingStore(build_store(config))
    http: Counter[str] = Counter()
    if backend.server is not None:  # also count real HTTP requests on the wire

        def on_send(request: Any, **_: Any) -> None:
            http[request.method] += 1

        store.inner._client().meta.events.register("before-send.s3", on_send)  # type: ignore[attr-defined]

    pq = PawnQueue(config, store=store).setup()  # type: ignore[arg-type]
    try:
        producer = pq.register_producer("p")
        store.calls.clear()
        http.clear()
        ids = [producer.publish("t", {"n": n}) for n in range(10)]
        ids += producer.publish_batch("t", [{"n": n} for n in range(10, 15)])
        marker = layout.topic_marker_key("t")
        assert store.calls[("head", marker)] == 1
        # and once the packed-topic manifest (absent: a plain topic; cached 30 s)
        assert store.calls[("head", layout.packed_manifest_key("t"))] == 1
        assert store.count("head") == 2
        assert store.count("put") == 15
        assert store.count("get") == store.count("list") == 0
        if backend.server is not None:
            assert http == Counter({"HEAD": 2, "PUT": 15})
        assert len(set(ids)) == 15
    finally:
        pq.teardown()
        store.inner.close()


# --------------------------------------------------------------------------- setup


def test_setup_lifecycle_probe_removed_and_strategy_auto(backend: Backend) -> None:
    pq = backend.queue()
    with pytest.raises(NotStartedError):
        pq.create_topic("orders")  # not set up yet
    assert pq.setup() is pq
    assert pq.setup() is pq  # idempotent: no second probe
    try:
        # the probe object is gone, and setup left nothing else behind either
        assert keys(pq, layout.PROBE_PREFIX) == []
        assert keys(pq) == []
        assert pq.config.concurrency.strategy == "auto"
        assert pq.strategy == "conditional_write"
        assert pq.context.caps.if_none_match is True
        pq.create_topic("orders")
        pq.register_producer("p").publish("orders", {"n": 1})
    finally:
        pq.teardown()
        pq.teardown()  # idempotent

    with backend.queue(**CSPRNG) as forced, backend.queue(**CONDITIONAL) as explicit:
        assert forced.strategy == "csprng_verify"
        assert explicit.strategy == "conditional_write"
        assert keys(forced, layout.PROBE_PREFIX) == []
        got = drain(forced.register_consumer("c", ["orders"]))
        assert [m.payload for m in got] == [{"n": 1}]


def test_a_run_takes_at_most_its_share_of_scarce_candidates_and_rounds_again(
    tmp_path: Path,
) -> None:
    """planning.choose, the pick of a batch claim among peers: from the consumer's place
    on, in id order; a share of scarce candidates (at least MIN_SHARE); near the last
    id the last ones, and then on from the first."""
    with PawnQueue.from_config({"local": {"path": str(tmp_path / "s")}, **CSPRNG}) as pq:
        pq.create_topic("t")
        consumer = pq.register_consumer("c", ["t"])
        consumer._peers, consumer._peers_at = (1, 3), pq.context.clock.monotonic()
        state = consumer._objects.state("t")
        ids = sorted(str(uuid.UUID(int=i * 2**120)) for i in range(256))
        candidates = [(f"t/messages/{mid}.json", mid) for mid in ids]

        def run_of(n: int, want: int) -> list[str]:
            chosen = planning.choose(state, candidates[:n], want, runs=True,
                                     peers=consumer._registered_peers, rng=random.Random())
            return [mid for _, mid in chosen]

        third = str(uuid.UUID(int=2**128 // 3))  # rank 1 of 3: from a third of the ids on
        first = run_of(256, 20)
        assert first == [mid for mid in ids if mid > third][:20]
        assert run_of(256, 20) == [mid for mid in ids if mid > first[-1]][:20]  # on
        state.cursor = None
        # 240 candidates among 3 peers: a share of 80, not all 128 wanted
        assert len(run_of(240, 128)) == 80
        state.cursor = None
        # scarce: 30 candidates, all below our place: at least _MIN_SHARE of them, so
        # all 30
        assert run_of(30, 128) == ids[:30]
        state.cursor = ids[-3]
        assert run_of(256, 10) == ids[-10:]  # near the last id: the last ten
        assert run_of(256, 10) == ids[:10]  # then on from the first
        assert run_of(256, 10) == ids[10:20]
