"""Bad input never corrupts the queue, and always fails with a PawnQueueError.

Payloads, topic names, credentials, endpoints, buckets, registry objects: each case
checks the exact error class and that nothing was written. Against SeaweedFS and moto
(``backend`` also includes the embedded local store where no server is involved).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pawn_queue_sync
from pawn_queue_sync import (
    ConfigError,
    InvalidTopicName,
    NotStartedError,
    PawnQueue,
    PawnQueueError,
    PayloadError,
    RegistrationError,
    StoreUnavailable,
    TopicNotFoundError,
    layout,
)
from pawn_queue_sync.queue.registry import stable_id
from tests.servers import S3Server, closed_port, config_dict, deep_merge

S3_FIXTURES = {"seaweedfs": "seaweedfs", "moto": "moto_s3"}


@pytest.fixture(params=["seaweedfs", "moto", "local"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A configuration on a fresh bucket of each server, or on a fresh local directory."""
    if request.param == "local":
        yield {"local": {"path": str(tmp_path / "store")}}
        return
    server: S3Server = request.getfixturevalue(S3_FIXTURES[request.param])
    bucket = server.make_bucket("bad")
    yield config_dict(server, bucket)
    if server.name == "seaweedfs":
        server.remove_bucket(bucket)


@pytest.fixture
def pq(config: dict[str, Any]) -> Iterator[PawnQueue]:
    """A started queue with one topic, ``t``, and a 1,000-byte message size limit."""
    limited = deep_merge(config, {"publishing": {"max_payload_bytes": 1000}})
    with PawnQueue.from_config(limited) as queue:
        queue.create_topic("t")
        yield queue


def all_keys(pq: PawnQueue, prefix: str = "") -> list[str]:
    return [o.key for o in pq.store.list(prefix).objects]


class Unserialisable:
    pass


# --------------------------------------------------------------------------- payloads

BAD_PAYLOADS = {
    "set": {1, 2, 3},
    "object": Unserialisable(),
    "nested-object": {"ok": [1, {"deep": Unserialisable()}]},
    "nan": math.nan,
    "nested-inf": {"x": [math.inf]},
    "bytes": b"raw",
    "tuple-key": {(1, 2): "x"},
}

TOO_LARGE = {
    "ascii": {"blob": "a" * 2000},
    "utf-8": {"blob": "é" * 600},  # 600 characters, but 1,200 bytes of UTF-8
    "many-items": ["x"] * 400,
}


def reject_bad_payloads(producer: Any, topic: str) -> None:
    """Every bad payload (publish and publish_batch) fails with PayloadError."""
    for case, payload in BAD_PAYLOADS.items():
        with pytest.raises(PayloadError) as info:
            producer.publish(topic, payload)
        assert "JSON" in str(info.value), case

    # over publishing.max_payload_bytes (1,000 here)
    for case, payload in TOO_LARGE.items():
        with pytest.raises(PayloadError) as info:
            producer.publish(topic, payload)
        assert "max_payload_bytes" in str(info.value), case

    # one bad payload in a batch: nothing of the batch is published
    for bad in [{"n": {1, 2}}, math.nan, TOO_LARGE["ascii"]]:
        with pytest.raises(PayloadError) as info:
            producer.publish_batch(topic, [{"n": 0}, {"n": 1}, bad, {"n": 3}])
        assert "#2" in str(info.value)

    with pytest.raises(PayloadError):
        producer.publish(topic, {"n": 1}, message_id="../../etc/passwd")


def test_bad_payloads_raise_and_write_nothing(pq: PawnQueue) -> None:
    producer = pq.register_producer("p")
    reject_bad_payloads(producer, "t")
    assert all_keys(pq, "t/") == ["t/.topic"]
    assert pq.topic_stats("t") == {"pending": 0, "leased": 0, "dead_letter": 0}

    # the producer still works afterwards, and well under the limit is fine
    ids = producer.publish_batch("t", [{"n": 0}, {"blob": "a" * 500}])
    assert [key[-41:-5] for key in all_keys(pq, "t/messages/")] == ids  # "-{id}.json"
    assert [m.id for m in pq.register_consumer("c", ["t"]).poll()] == ids


# --------------------------------------------------------------------------- topic names

BAD_TOPICS: dict[str, Any] = {
    "slash": "a/b",
    "leading-slash": "/abs",
    "dotdot": "..",
    "dotdot-inside": "a..b",
    "parent-path": "../escape",
    "nul": "bad\x00name",
    "newline": "new\nline",
    "tab": "tab\tname",
    "del": "del\x7f",
    "empty": "",
    "129-chars": "x" * 129,
    "leading-underscore": "_registry",
    "leading-dot": ".hidden",
    "space": "has space",
    "non-ascii": "ünïcode",
    "star": "wild*",
    "not-a-string": 42,
    "none": None,
}


def test_topic_names_are_validated_everywhere(pq: PawnQueue) -> None:
    producer = pq.register_producer("p")
    before = all_keys(pq)
    for case, topic in BAD_TOPICS.items():
        with pytest.raises(InvalidTopicName) as info:
            pq.create_topic(topic)
        assert info.value.topic == topic, case
        with pytest.raises(InvalidTopicName):
            producer.publish(topic, {"a": 1})
        with pytest.raises(InvalidTopicName):
            producer.publish_batch(topic, [{"a": 1}])
        with pytest.raises(InvalidTopicName):
            pq.register_consumer("c", topics=["t", topic])
        with pytest.raises(InvalidTopicName):
            pq.topic_stats(topic)
        with pytest.raises(InvalidTopicName):
            pq.topic_exists(topic)
    assert all_keys(pq) == before  # nothing written, not even a consumer registration
    assert pq.list_topics() == ["t"]

    # names at the edges of what is allowed work end to end
    names = ["x" * 128, "a", "A.b-c_d.9", "-dash", "9"]
    for topic in names:
        assert pq.create_topic(topic) is True
    ids = {topic: producer.publish(topic, {"topic": topic}) for topic in names}
    consumer = pq.register_consumer("c", names)
    got = {m.topic: (m.id, m.payload) for m in consumer.poll(len(names))}
    assert got == {topic: (ids[topic], {"topic": topic}) for topic in names}
    assert pq.list_topics() == sorted([*names, "t"])


# --------------------------------------------------------------------------- connection


def test_missing_credentials_fail_with_a_clear_error(
    s3_server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    for name in list(os.environ):
        if name.startswith(("AWS_", "PAWNQUEUE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    config = config_dict(s3_server, bucket)
    del config["s3"]["aws_access_key_id"], config["s3"]["aws_secret_access_key"]

    pq = PawnQueue.from_config(config)
    with pytest.raises(StoreUnavailable) as info:
        pq.setup()
    assert "credentials" in str(info.value)
    assert isinstance(info.value, PawnQueueError)
    with pytest.raises(NotStartedError):
        pq.create_topic("t")  # setup failed: the queue is not started
    assert s3_server.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_only_one_of_the_two_keys_is_a_config_error() -> None:
    s3 = {"endpoint_url": "http://127.0.0.1:9", "bucket_name": "b-1", "aws_access_key_id": "k"}
    with pytest.raises(ConfigError) as info:
        PawnQueue.from_config({"s3": s3})
    assert info.value.field == "s3.aws_secret_access_key"


def test_unreachable_endpoint_fails_fast() -> None:
    port = closed_port()
    config = {
        "s3": {
            "endpoint_url": f"http://127.0.0.1:{port}",
            "bucket_name": "nowhere",
            "aws_access_key_id": "test",
            "aws_secret_access_key": "test",
            "use_ssl": False,
            "connect_timeout_seconds": 0.5,
            "max_attempts": 1,
        }
    }
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        PawnQueue.from_config(config).setup()
    assert time.monotonic() - started < 10.0  # one refused connection; the rest is CPU
    assert f"127.0.0.1:{port}" in str(info.value)


def test_missing_bucket_is_unavailable_unless_create_bucket(s3_server: S3Server) -> None:
    name = f"missing-{uuid.uuid4().hex[:12]}"
    config = config_dict(s3_server, name)
    with pytest.raises(StoreUnavailable) as info:
        PawnQueue.from_config(config).setup()
    assert name in str(info.value)
    assert "create_bucket" in str(info.value)
    buckets = {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}
    assert name not in buckets  # nothing was created behind our back

    try:
        with PawnQueue.from_config(deep_merge(config, {"s3": {"create_bucket": True}})) as pq:
            pq.create_topic("t")
            mid = pq.register_producer("p").publish("t", {"n": 1})
            assert [m.id for m in pq.register_consumer("c", ["t"]).poll()] == [mid]
        # and again, now that it exists
        with PawnQueue.from_config(deep_merge(config, {"s3": {"create_bucket": True}})) as pq:
            assert pq.list_topics() == ["t"]
    finally:
        s3_server.remove_bucket(name)


# --------------------------------------------------------------------------- registry


def test_corrupt_registry_objects_do_not_break_registration(pq: PawnQueue) -> None:
    legacy_id = str(uuid.uuid4())
    random_keys = [layout.registry_key("producers", str(uuid.uuid4())) for _ in range(4)]
    junk = {
        "_registry/producers/garbage.json": b"\xff not json",
        random_keys[0]: b'{"name": "svc"}',  # fields missing
        random_keys[1]: b"[1, 2, 3]",
        random_keys[2]: b'{"role": "producers", "name": "svc"',  # truncated
        random_keys[3]: b"",
        "_registry/producers/nested/deeper.json": b"{}",
        # our own key for "broken" holds garbage: it is repaired, keeping the id
        layout.registry_key("producers", stable_id("producers", "broken")): b"garbage",
        layout.registry_key("consumers", stable_id("consumers", "broken")): b"[]",
        # a readable pawn-queue entry (uuid4 id) is still found and reused
        f"_registry/producers/{legacy_id}.json": json.dumps(
            {
                "role": "producers",
                "name": "legacy",
                "entity_id": legacy_id,
                "registered_at": "2024-01-01T00:00:00+00:00",
                "last_seen": "2024-01-01T00:00:00+00:00",
            }
        ).encode(),
    }
    for key, body in junk.items():
        pq.store.put(key, body)

    svc = pq.register_producer("svc")
    assert svc.id == stable_id("producers", "svc")
    assert pq.register_producer("svc").id == svc.id
    assert pq.register_producer("legacy").id == legacy_id
    broken = pq.register_producer("broken")
    assert broken.id == stable_id("producers", "broken")
    assert pq.register_producer("broken").id == broken.id
    assert pq.register_consumer("broken", ["t"]).id == stable_id("consumers", "broken")
    repaired = json.loads(pq.store.get(layout.registry_key("producers", broken.id)).body)
    assert (repaired["name"], repaired["entity_id"]) == ("broken", broken.id)

    entries = pq.list_registrations()  # unreadable entries are skipped, not fatal
    assert sorted((e.role, e.name) for e in entries) == [
        ("consumers", "broken"),
        ("producers", "broken"),
        ("producers", "legacy"),
        ("producers", "svc"),
    ]
    # publishing and consuming are unaffected
    mid = svc.publish("t", {"n": 1})
    assert [m.id for m in pq.register_consumer("c", ["t"]).poll()] == [mid]


def test_bad_registrations_raise_registration_error_and_write_nothing(pq: PawnQueue) -> None:
    for name in ("", "x" * 257, None, 17):
        with pytest.raises(RegistrationError):
            pq.register_producer(name)  # type: ignore[arg-type]
        with pytest.raises(RegistrationError):
            pq.register_consumer(name, ["t"])  # type: ignore[arg-type]
    for topics in ([], ()):  # checked before anything is written
        with pytest.raises(RegistrationError):
            pq.register_consumer("c", topics=topics)
    with pytest.raises(TopicNotFoundError):
        pq.register_consumer("c", topics="ghost")  # a bare string is one topic
    assert all_keys(pq, "_registry/") == []


def test_bad_configuration_raises_config_error() -> None:
    for bad in (
        {"s3": {"bucket_name": "Not_A_Bucket"}},
        {"s3": {"endpoint_url": "ftp://host", "bucket_name": "b-1"}},
        {"polling": {"max_messages_per_poll": 0}},
        {"concurrency": {"strategy": "optimistic"}},
        {"publishing": {"max_payload_bytes": -1}},
        {"unknown": 1},
    ):
        with pytest.raises(ConfigError):
            PawnQueue.from_config(bad)


# --------------------------------------------------------------------------- hierarchy


def test_every_exported_error_is_a_pawn_queue_error() -> None:
    errors = [
        obj
        for name in pawn_queue_sync.__all__
        if isinstance(obj := getattr(pawn_queue_sync, name), type)
        and issubclass(obj, BaseException)
    ]
    assert len(errors) >= 10
    assert all(issubclass(e, PawnQueueError) for e in errors), errors


def test_every_error_of_the_hierarchy_is_exported_from_the_root() -> None:
    """Errors once importable only from pawn_queue_sync.errors (StoreFull, StoreClosed,
    ObjectNotFound, ...) are all at the package root, as docs/api.md says."""
    import pawn_queue_sync.errors as errors_module

    defined = {
        name
        for name, obj in vars(errors_module).items()
        if isinstance(obj, type) and issubclass(obj, PawnQueueError)
        and obj.__module__ == errors_module.__name__
    }
    assert len(defined) >= 20
    assert sorted(defined - set(pawn_queue_sync.__all__)) == []


@pytest.mark.parametrize("settle", ["retry", "nack"])
def test_a_retry_or_nack_reason_that_is_not_text_is_a_type_error(settle: str) -> None:
    """``retry(msg, ValueError("x"))`` failed deep inside with "'ValueError' object is not
    subscriptable"; the message must stay leased and untouched."""
    from pawn_queue_sync import testing

    with testing.memory_queue(topics=["jobs"]) as pq:
        pq.register_producer("p").publish("jobs", {"n": 1})
        consumer = pq.register_consumer("c", ["jobs"])
        (msg,) = consumer.poll()
        with pytest.raises(TypeError, match="a str or None"):
            getattr(consumer, settle)(msg, ValueError("boom"))
        assert pq.topic_stats("jobs") == {"pending": 1, "leased": 1, "dead_letter": 0}
        getattr(consumer, settle)(msg, "boom")  # a text is fine
