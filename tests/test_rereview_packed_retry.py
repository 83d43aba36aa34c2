"""Re-review 16B RR1, finding 1 (of 7e4466c): a packed retry(delay_seconds=) whose
segment-lease write (the one carrying its settlement) lands but is answered 412
(guarantees.md, "Lost answers to conditional requests": botocore retried a conditional
PUT whose first attempt was applied) removed its delayed copy. The landed lease
records the message settled, so the segment's next holder skips it: the message was
never delivered again. guarantees.md says such a lost answer delays, never loses.
MemoryStore under a manual FakeClock."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from typing import Any

from pawn_queue_sync import LeaseLostError, layout
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.errors import ConditionFailed
from pawn_queue_sync.testing import memory_queue

TOPIC = "jobs"
START = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


def test_a_packed_retry_whose_settling_write_is_answered_412_loses_nothing() -> None:
    clock = FakeClock(START)
    with memory_queue({"polling": {"interval_seconds": 1.0}}, clock=clock) as pq:
        pq.create_topic(TOPIC, packed=True)
        ids = pq.register_producer("p").publish_batch(TOPIC, [{"n": i} for i in range(3)])
        consumer = pq.register_consumer("a", [TOPIC])
        first = consumer.poll(max_messages=1)
        assert len(first) == 1 and first[0].segment is not None
        victim = first[0]
        store = pq.store
        inner_put = store.put
        state: dict[str, Any] = {"delayed_written": False, "injected": False}

        def put(key: str, body: bytes, **kwargs: Any) -> Any:
            result = inner_put(key, body, **kwargs)
            if key.startswith(layout.delayed_prefix(TOPIC)):
                state["delayed_written"] = True
            elif (state["delayed_written"] and not state["injected"]
                  and key.startswith(layout.segment_leases_prefix(TOPIC))):
                state["injected"] = True  # applied; the retried request gets 412
                raise ConditionFailed("put: condition failed (412, injected)", key=key)
            return result

        store.put = put  # type: ignore[method-assign]
        raised = None
        try:
            victim.retry(delay_seconds=5)
        except LeaseLostError as exc:
            raised = exc
        store.put = inner_put  # type: ignore[method-assign]
        assert state["injected"], "the settling write was not made"
        seen: Counter[str] = Counter({victim.id: 1})
        other = pq.register_consumer("b", [TOPIC])
        for _ in range(40):
            clock.advance(pq.context.visibility / 10 + 1)
            for c in (consumer, other):
                try:
                    for msg in c.poll(max_messages=10):
                        seen[msg.id] += 1
                        msg.ack()
                except LeaseLostError:
                    pass
        assert set(seen) == set(ids), seen
        delayed_keys = [o.key for o in store.list(layout.delayed_prefix(TOPIC)).objects]
        message_keys = [o.key for o in store.list(layout.messages_prefix(TOPIC)).objects]
        assert seen[victim.id] >= 2, (
            f"retried message delivered {seen[victim.id]} time(s) in all (retry raised "
            f"{raised!r}); delayed/ holds {delayed_keys}, messages/ {message_keys}: lost")
