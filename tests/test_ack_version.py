"""An ack deletes only the version of the message it was handed.

``publish(message_id=X, created_at=T)`` is the idempotent path: it writes the same key
again. Done while a consumer holds X, it replaced the held object; before, the holder's
ack (and nack) deleted the key unconditionally, so the new version was never
delivered. Now the delete is conditional on the ETag the consumer read (a single
DELETE with If-Match, or DeleteObjects naming each key's ETag); a version that was
replaced is left, the lease is given back, and the new version is delivered.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, layout
from tests.test_consumer_regressions import TOPIC, memory_queue, objects

WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)


def republish_while_held(pq: PawnQueue, acker: str, others: int = 0) -> None:
    """Publish X (and ``others`` more), claim all, republish X with new content at
    the same key, settle the held version with ``acker``; X's new version must then be
    delivered, once."""
    producer = pq.register_producer("p")
    mid = str(uuid.uuid4())
    producer.publish(TOPIC, "v1", message_id=mid, created_at=WHEN)
    for i in range(others):
        producer.publish(TOPIC, f"other{i}")
    consumer = pq.register_consumer("c", [TOPIC])
    held = consumer.poll(10)
    assert len(held) == 1 + others
    (x,) = [m for m in held if m.id == mid]
    assert x.payload == "v1"
    producer.publish(TOPIC, "v2", message_id=mid, created_at=WHEN)  # the same key
    if acker == "ack":
        x.ack()
    elif acker == "ack_many":
        consumer.ack_many(held)
    else:
        x.nack("bad")
    assert x.state == ("nacked" if acker == "nack" else "acked")
    (key,) = [k for k in objects(pq, layout.messages_prefix(TOPIC))]
    assert json.loads(pq.store.get(key).body)["payload"] == "v2"
    assert objects(pq, layout.leases_prefix(TOPIC)) == []  # our lease was given back
    (again,) = consumer.poll(10)
    assert (again.id, again.payload, again.delivery_count) == (mid, "v2", 1)
    again.ack()
    assert objects(pq, f"{TOPIC}/messages/") == []


@pytest.mark.parametrize("acker", ["ack", "ack_many", "nack"])
def test_a_republished_message_survives_the_ack_of_its_old_version_memory(acker: str) -> None:
    pq = memory_queue()
    republish_while_held(pq, acker, others=2 if acker == "ack_many" else 0)
    pq.teardown()


@pytest.mark.parametrize("acker", ["ack", "ack_many", "nack"])
def test_a_republished_message_survives_the_ack_of_its_old_version_seaweedfs(
    acker: str, real_s3_config: dict[str, Any]
) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        pq.create_topic(TOPIC)
        republish_while_held(pq, acker, others=2 if acker == "ack_many" else 0)


def test_an_unchanged_message_is_acked_in_one_batch_request() -> None:
    """The conditional batch delete costs what the unconditional one did: one
    DeleteObjects for the messages, one for the leases."""
    pq = memory_queue()
    pq.register_producer("p").publish_batch(TOPIC, range(20))
    consumer = pq.register_consumer("c", [TOPIC])
    msgs = consumer.poll(20)
    calls: list[tuple[str, int]] = []
    store = pq.store
    delete, delete_many = store.delete, store.delete_many

    def counting_delete(key: str, **kw: Any) -> None:
        calls.append(("delete", 1))
        delete(key, **kw)

    def counting_delete_many(keys: Any, **kw: Any) -> list[str]:
        keys = list(keys)
        calls.append(("delete_many", len(keys)))
        return delete_many(keys, **kw)

    store.delete = counting_delete  # type: ignore[method-assign]
    store.delete_many = counting_delete_many  # type: ignore[method-assign]
    consumer.ack_many(msgs)
    assert calls == [("delete_many", 20), ("delete_many", 20)]
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "boto3"])
def test_delete_many_deletes_only_the_versions_named_seaweedfs(
    fast_path: bool, real_s3: Any, real_bucket: str
) -> None:
    """DeleteObjects with per-key ETags, measured on SeaweedFS: a replaced version
    stays and is reported not deleted, the named versions go, keys without an ETag go,
    a missing key is no failure."""
    from tests.test_s3_fast_path import _store

    store = _store(real_s3, real_bucket, fast_path=fast_path)
    assert store.fast_path is fast_path
    old = {k: store.put(k, b"v1").etag for k in ("t/a", "t/b", "t/c")}
    store.put("t/b", b"v2")  # replaced since we read it
    assert store.delete_many(["t/a", "t/b", "t/c", "t/gone"],
                             etags={"t/a": old["t/a"], "t/b": old["t/b"],
                                    "t/gone": old["t/a"]}) == ["t/b"]
    assert [o.key for o in store.list("t/").objects] == ["t/b"]
    assert store.get("t/b").body == b"v2"


def test_an_identical_republish_while_held_is_acked_with_it() -> None:
    """The idempotent path re-publishing the very same message (a retried task): the
    message was handled, so the ack deletes it rather than deliver it again."""
    pq = memory_queue()
    producer = pq.register_producer("p")
    mid = str(uuid.uuid4())
    producer.publish(TOPIC, {"same": 1}, message_id=mid, created_at=WHEN)
    consumer = pq.register_consumer("c", [TOPIC])
    (msg,) = consumer.poll()
    pq.register_producer("p2").publish(TOPIC, {"same": 1}, message_id=mid, created_at=WHEN)
    assert pq.store.get(msg.key).etag != msg.etag  # another producer id: new bytes
    msg.ack()
    assert objects(pq, f"{TOPIC}/messages/") == objects(pq, f"{TOPIC}/leases/") == []
    pq.teardown()
