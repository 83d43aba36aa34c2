"""Delayed messages and pawn-queue 0.1.3 sharing a bucket (SeaweedFS): its consumers
never see a delayed message before it is due (it is not under ``messages/``), and see it
once after this library promoted it; a delayed retry leaves nothing it can take early."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, layout
from pawn_queue_sync.queue import promotion
from tests.interop import pawnqueue_consume
from tests.servers import deep_merge

pytestmark = pytest.mark.interop

TOPIC = "later"
DEADLINE = 60.0


def wait_promoted(pq: PawnQueue, want: int) -> None:
    """Promote (as a consumer's poll would) until ``want`` messages were moved."""
    moved = 0
    end = time.monotonic() + DEADLINE
    while moved < want:
        assert time.monotonic() < end, f"{moved} of {want} promoted"
        moved += promotion.promote_due(pq.context, TOPIC).promoted


def test_pawnqueue_sees_a_delayed_message_only_once_it_was_promoted(
    real_s3_config: dict[str, Any],
) -> None:
    with PawnQueue(deep_merge(real_s3_config, {"polling": {"interval_seconds": 0.05}})) as pq:
        pq.create_topic(TOPIC)
        producer = pq.register_producer("p")
        far = producer.publish(TOPIC, {"far": True}, delay_seconds=3600)
        soon = producer.publish(TOPIC, {"soon": True}, delay_seconds=2)
        now = producer.publish(TOPIC, {"now": True})
        got = pawnqueue_consume(real_s3_config, TOPIC, 10, empty_polls=5)
        assert [m["id"] for m in got] == [now]  # neither delayed one, not even early
        wait_promoted(pq, 1)
        got = pawnqueue_consume(real_s3_config, TOPIC, 10, empty_polls=5)
        assert [m["id"] for m in got] == [soon] and got[0]["payload"] == {"soon": True}
        assert pawnqueue_consume(real_s3_config, TOPIC, 10, empty_polls=3) == []
        left = [layout.parse_delayed_key(TOPIC, o.key)
                for o in pq.store.list(layout.delayed_prefix(TOPIC)).objects]
        assert [n.message_id if n else None for n in left] == [far]
        assert not pq.store.list(layout.messages_prefix(TOPIC)).objects


def test_a_delayed_retry_is_not_taken_early_by_pawnqueue(
    real_s3_config: dict[str, Any],
) -> None:
    with PawnQueue(deep_merge(real_s3_config, {"polling": {"interval_seconds": 0.05}})) as pq:
        pq.create_topic(TOPIC)
        [mid] = pq.register_producer("p").publish_batch(TOPIC, [{"n": 1}])
        consumer = pq.register_consumer("c", [TOPIC])
        [msg] = consumer.poll()
        msg.retry(delay_seconds=3600, error="later")
        assert pawnqueue_consume(real_s3_config, TOPIC, 10, empty_polls=5) == []
        [name] = [layout.parse_delayed_key(TOPIC, o.key)
                  for o in pq.store.list(layout.delayed_prefix(TOPIC)).objects]
        assert name is not None and name.message_id == mid and name.delay_ms == 3600000
