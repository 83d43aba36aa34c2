"""Byte compatibility with pawn-queue 0.1.3, proven by running pawn-queue itself.

pawn-queue runs in a venv of its own, in a subprocess (see ``tests/interop.py``), on
the same bucket of the same server as this library; it uses ``conditional_write``.
Each test starts one pawn-queue process (they take seconds to start: aioboto3).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, layout
from pawn_queue_sync.queue.registry import stable_id
from tests.interop import pawnqueue_publish, run_pawnqueue

pytestmark = pytest.mark.interop

PAYLOADS: list[dict[str, Any]] = [
    {"order_id": 1, "text": "héllo wörld ✓ 日本語 🎉"},
    {"order_id": 2, "nested": {"a": [1, {"b": [None, True, False]}], "empty": {}}},
    {"order_id": 3, "big": 2**64 + 1, "float": 0.1, "neg": -1.5e-300},
    {"order_id": 4, "quote": 'say "hi" \\ bye\n', "list": []},
]

#: pawn-queue consumes (polls twice, acks), parses every dead letter with its own
#: Message class, and registers a producer: one process for all, they are slow to start.
_CONSUME_AND_READ = """
import asyncio

from pawn_queue import PawnQueue
from pawn_queue.message import Message


async def main():
    pq = await PawnQueue.from_config(CONFIG)
    await pq.setup()
    try:
        consumer = await pq.register_consumer(ARGS["consumer"], topics=[ARGS["topic"]])
        polls = []
        for _ in range(2):
            got = await consumer.poll()
            for m in got:
                await m.ack()
            polls.append([m.to_dict() for m in got])
        client = pq._client
        dead = []
        for key in await client.list_objects(ARGS["dead_letter_prefix"]):
            data = await client.get_object_json(key)
            msg = Message.from_dict(data, s3_key=key, client=client)
            dead.append({"key": key, "message": msg.to_dict(), "raw": data})
        producer = await pq.register_producer(ARGS["producer"])
        return {
            "polls": polls,
            "dead": dead,
            "producer_id": producer.id,
            "consumer_id": consumer.id,
        }
    finally:
        await pq.teardown()


emit(asyncio.run(main()))
"""


def raw_messages(pq: PawnQueue, topic: str) -> list[dict[str, Any]]:
    """The message objects of ``topic`` as stored, in key order."""
    out = []
    for info in pq.store.list(layout.messages_prefix(topic)).objects:
        doc = json.loads(pq.store.get(info.key).body)
        doc["_key"] = info.key
        out.append(doc)
    return out


def test_messages_published_by_pawnqueue_are_consumed_here(s3_config: dict[str, Any]) -> None:
    before = datetime.now(timezone.utc)
    ids = pawnqueue_publish(s3_config, "orders", PAYLOADS, producer="pq-service")
    after = datetime.now(timezone.utc)
    assert len(ids) == len(set(ids)) == len(PAYLOADS)

    with PawnQueue.from_config(s3_config) as pq:
        assert pq.list_topics() == ["orders"]  # pawn-queue's topic marker is a topic here
        stored = raw_messages(pq, "orders")
        assert [layout.parse_message_key("orders", d["_key"]) for d in stored] == ids

        consumer = pq.register_consumer("billing", ["orders"])
        got = consumer.poll(10)
        assert [m.id for m in got] == ids
        assert [m.payload for m in got] == PAYLOADS
        assert {m.topic for m in got} == {"orders"}
        producer_ids = {m.producer_id for m in got}
        assert len(producer_ids) == 1
        pq_producer_id = producer_ids.pop()
        assert pq_producer_id != stable_id("producers", "pq-service")  # pawn-queue's uuid4
        for msg, doc in zip(got, stored):
            assert msg.created_at == doc["created_at"]
            created = datetime.fromisoformat(msg.created_at)
            assert created.tzinfo is not None
            assert before - timedelta(seconds=1) <= created <= after + timedelta(seconds=1)

        # the name pawn-queue registered is reused here: same id, no second entry
        assert pq.register_producer("pq-service").id == pq_producer_id
        producers = pq.list_registrations("producers")
        assert [(e.name, e.entity_id) for e in producers] == [("pq-service", pq_producer_id)]

        # a pawn-queue message nacked here keeps all of pawn-queue's fields
        got[0].nack("nacked here")
        consumer.ack_many(got[1:])
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 1}
        dead = json.loads(pq.store.get(layout.dead_letter_key("orders", ids[0])).body)
        original = {k: v for k, v in stored[0].items() if k != "_key"}
        assert {k: dead[k] for k in original} == original
        assert dead["dead_letter"]["reason"] == "nacked here"


def test_messages_dead_letters_and_names_from_here_are_read_by_pawnqueue(
    s3_config: dict[str, Any],
) -> None:
    reason = "rejected: bad order ✗"
    with PawnQueue.from_config(s3_config) as pq:
        pq.create_topic("orders")
        producer = pq.register_producer("sync-service")
        billing = pq.register_consumer("billing", ["orders"])  # pawn-queue reuses the name
        holder = pq.register_consumer("holder", ["orders"])
        # the two oldest messages stay leased here: pawn-queue must leave them alone
        held_ids = producer.publish_batch("orders", [{"held": 1}, {"held": 2}])
        held = holder.poll(2)
        assert [m.id for m in held] == held_ids
        # the next two are nacked here: pawn-queue must be able to read the dead letters
        nacked_ids = producer.publish_batch("orders", [{"nack": 1}, {"nack": 2}])
        for msg in holder.poll(2):
            msg.nack(reason)
        ids = [producer.publish("orders", p) for p in PAYLOADS]
        stored = {d["id"]: d for d in raw_messages(pq, "orders")}

        result = run_pawnqueue(
            _CONSUME_AND_READ,
            {**s3_config, "concurrency": {"strategy": "conditional_write"}},
            args={
                "topic": "orders",
                "consumer": "billing",
                "producer": "sync-service",
                "dead_letter_prefix": layout.dead_letter_prefix("orders"),
            },
        )

        # pawn-queue got exactly the unleased messages, fields intact, in order
        first, second = result["polls"]
        assert second == []
        assert [m["id"] for m in first] == ids
        assert [m["payload"] for m in first] == PAYLOADS
        assert {(m["topic"], m["producer_id"]) for m in first} == {("orders", producer.id)}
        assert [m["created_at"] for m in first] == [stored[i]["created_at"] for i in ids]
        # it acked them; the held messages are still ours to ack
        assert pq.topic_stats("orders") == {"pending": 2, "leased": 2, "dead_letter": 2}
        holder.ack_many(held)
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 2}

    # pawn-queue parsed each dead letter into its own Message, fields intact
    dead = {d["message"]["id"]: d for d in result["dead"]}
    assert sorted(dead) == sorted(nacked_ids)
    for mid, payload in zip(nacked_ids, [{"nack": 1}, {"nack": 2}]):
        entry = dead[mid]
        assert entry["key"] == layout.dead_letter_key("orders", mid)
        assert entry["message"] == {
            "id": mid,
            "topic": "orders",
            "producer_id": producer.id,
            "created_at": entry["raw"]["created_at"],
            "payload": payload,
        }
        assert entry["raw"]["dead_letter"]["reason"] == reason
    # pawn-queue found our registrations of the names and reused their ids
    assert result["producer_id"] == producer.id == stable_id("producers", "sync-service")
    assert result["consumer_id"] == billing.id == stable_id("consumers", "billing")
