"""Re-review 16B RR1, finding 4 (of b35a31d/5699136): an idle poll's page that shows a due delayed
message runs a promotion pass on every poll, not once a poll interval. While another
promoter holds the topic's lock (moving a backlog; or a dead one's lock not yet
stale), every idle poll of every other consumer then pays the lock's PUT and GET on
top of its LIST: a tight poll() loop 8 polls in 2 s makes 8 PUTs and 8 GETs of the
lock (before the idle LIST: a pass at most once an interval, 2 of each). 5699136 gated
the LIST of delayed/ this way, not the lock. MemoryStore under a manual FakeClock."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

from pawn_queue_sync import layout
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.testing import memory_queue

TOPIC = "quiet"
START = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


def test_idle_polls_locked_out_of_promotion_try_the_lock_at_most_once_an_interval() -> None:
    clock = FakeClock(START)
    ops: Counter[str] = Counter()

    def hook(op: str, key: str) -> None:
        if key == layout.delayed_lock_key(TOPIC) or op == "list":
            ops[f"{op} {key}"] += 1

    with memory_queue({"polling": {"interval_seconds": 1.0}}, topics=[TOPIC], clock=clock,
                      hooks=hook) as pq:
        producer = pq.register_producer("p")
        producer.publish(TOPIC, {"n": 1}, delay_seconds=1)
        clock.advance(2)  # due
        # another consumer's live promotion lock (as a holder writes it)
        pq.store.put(layout.delayed_lock_key(TOPIC),
                     layout.canonical_json({"at": layout.iso(clock.now()),
                                            "lifetime_seconds": 300.0}))
        consumer = pq.register_consumer("c", [TOPIC])
        ops.clear()
        for _ in range(8):
            assert consumer.poll() == []  # locked out: the holder moves it
            clock.advance(0.25)  # 2 s in all: a pass at 0 and at 1 s
        lock = layout.delayed_lock_key(TOPIC)
        assert ops[f"put {lock}"] <= 2 and ops[f"get {lock}"] <= 2, dict(ops)
