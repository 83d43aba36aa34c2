"""What a consumer keeps of the listeners running its listen(): a declared set that
stop() and close() stop, every one of them, and that empties as they return."""

from __future__ import annotations

import threading

from pawn_queue_sync import Message
from pawn_queue_sync.clock import SYSTEM_CLOCK
from pawn_queue_sync.testing import memory_queue
from tests.threads import DEADLINE, join, run_in_thread, wait_until


def test_close_stops_every_listener_of_the_consumer_and_forgets_them() -> None:
    # The real clock: close() must return True once both listeners finished, which no
    # timeout decides; an auto FakeClock jumped its 90 s while the listeners' shutdown
    # waited on threads (no clock call) on a loaded CI, and close() said False at once.
    with memory_queue(topics=["t"], clock=SYSTEM_CLOCK) as pq:  # type: ignore[arg-type]
        pq.register_producer("p").publish_batch("t", [{"n": n} for n in range(4)])
        consumer = pq.register_consumer("c", ["t"])
        assert consumer.close(1.0) and consumer._listeners == set()  # none: nothing to do
        started = threading.Barrier(3, timeout=DEADLINE)  # two handlers and the test

        def handler(msg: Message) -> None:
            if msg.payload["n"] < 2:
                started.wait()

        runners = [run_in_thread(lambda: consumer.listen(handler, max_workers=1))
                   for _ in range(2)]
        wait_until(lambda: len(consumer._listeners) == 2, "two listeners running")
        started.wait()  # each listener is in a handler
        assert consumer.close(DEADLINE) is True
        for runner in runners:
            join(runner)
        assert consumer._listeners == set()


def test_stop_asks_every_running_listener_to_stop() -> None:
    with memory_queue(topics=["t"]) as pq:
        consumer = pq.register_consumer("c", ["t"])
        consumer.stop()  # nothing running: nothing to do
        runners = [run_in_thread(lambda: consumer.listen(lambda m: None, max_workers=1))
                   for _ in range(2)]
        wait_until(lambda: len(consumer._listeners) == 2, "two listeners running")
        consumer.stop()
        for runner in runners:
            join(runner)
        assert consumer._listeners == set()
