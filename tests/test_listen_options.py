"""``Consumer.listen`` takes the listener's options that the docs show
(``install_signal_handlers``, ``shutdown_timeout``, ``max_messages``, ``idle_timeout``);
it once accepted only ``max_workers`` and ``stop_event``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pawn_queue_sync import Message, PawnQueue


def test_listen_takes_the_documented_listener_options(tmp_path: Path) -> None:
    with PawnQueue({"local": {"path": str(tmp_path)}}) as pq:
        pq.create_topic("orders")
        ids = pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(5)])
        consumer = pq.register_consumer("c", ["orders"])
        seen: list[str] = []
        lock = threading.Lock()

        def handle(msg: Message) -> None:
            with lock:
                seen.append(msg.id)

        consumer.listen(
            handle, max_workers=2, install_signal_handlers=True, shutdown_timeout_seconds=5.0,
            max_messages=3,
        )
        assert len(seen) == 3 and set(seen) <= set(ids)
        consumer.listen(handle, idle_timeout_seconds=0.2)  # returns once the topic is idle
        assert sorted(seen) == sorted(ids)
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 0}
        with pytest.raises(TypeError):
            consumer.listen(handle, no_such_option=1)
