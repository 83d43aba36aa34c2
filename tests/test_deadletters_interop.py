"""Dead letters written by pawn-queue 0.1.3 itself (its nack: a plain copy of the
message, no reason) read and redriven here, on SeaweedFS."""

from __future__ import annotations

from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, layout
from tests.interop import pawnqueue_config, run_pawnqueue
from tests.servers import deep_merge
from tests.test_deadletters import FAST, drain

pytestmark = pytest.mark.interop

#: pawn-queue publishes, then polls and nacks until it has nacked them all.
_PUBLISH_AND_NACK = """
import asyncio

from pawn_queue import PawnQueue


async def main():
    pq = await PawnQueue.from_config(CONFIG)
    await pq.setup()
    try:
        await pq.create_topic(ARGS["topic"])
        producer = await pq.register_producer("pq-producer")
        ids = [await producer.publish(ARGS["topic"], p) for p in ARGS["payloads"]]
        consumer = await pq.register_consumer("pq-nacker", topics=[ARGS["topic"]])
        nacked = []
        for _ in range(50):
            for m in await consumer.poll():
                await m.nack()
                nacked.append({"id": m.id, "created_at": m.created_at})
            if len(nacked) >= len(ids):
                break
            await asyncio.sleep(0.1)
        return {"ids": ids, "nacked": nacked}
    finally:
        await pq.teardown()


emit(asyncio.run(main()))
"""


def test_pawnqueue_dead_letters_read_and_redrive(real_s3_config: dict[str, Any]) -> None:
    payloads = [{"order": i, "text": "héllo"} for i in range(3)]
    result = run_pawnqueue(_PUBLISH_AND_NACK, pawnqueue_config(real_s3_config,
                                                               "conditional_write"),
                           args={"topic": "legacy", "payloads": payloads})
    nacked = {n["id"]: n["created_at"] for n in result["nacked"]}
    assert sorted(nacked) == sorted(result["ids"])
    with PawnQueue(deep_merge(real_s3_config, FAST)) as pq:
        letters = {d.id: d for d in pq.dead_letters("legacy")}
        assert set(letters) == set(nacked)
        for mid, d in letters.items():
            assert d.redrivable and "no reason recorded" in d.reason
            assert d.created_at == nacked[mid] and d.payload in payloads
            assert d.dead_lettered_at  # the object's LastModified stands in
            assert d.delivery_count is None and d.original_key is None
        assert sorted(pq.redrive("legacy").moved) == sorted(nacked)
        got = drain(pq.register_consumer("here", ["legacy"]), set(nacked), lambda m: m.ack())
        assert {mid: g["created_at"] for mid, g in got.items()} == nacked
        assert pq.store.list(layout.dead_letter_prefix("legacy")).objects == []
