"""Re-review RR2: EventBus after review 16B's fix ("a dispatcher thread that ended anyway is
started again by the next event").

The dispatcher decides to end (closing, queue empty) under the lock, releases it, and
only later, in ``_run``'s ``finally``, retakes it to clear ``self._thread``. An
``open()`` and a ``publish()`` in that window see the old thread still alive, start no
other, and queue their event; the ending thread then clears ``_thread`` and exits. The
event sits queued, undelivered, until some LATER event starts a thread (flush() hangs
until its timeout; the last event before a quiet period is never seen). The window is
held open here by wrapping ``_dispatch`` (the code between its return and the
``finally`` of ``_run`` is exactly that window)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

from pawn_queue_sync.events import Event, EventBus


def _event(n: int) -> Event:
    return Event(kind="published", topic="t", at=datetime.now(timezone.utc),
                 message_id=str(n))


def test_an_event_published_while_the_dispatcher_ends_is_delivered() -> None:
    got: list[str] = []
    bus = EventBus(callbacks=[lambda e: got.append(e.message_id)])
    ended, go = threading.Event(), threading.Event()
    real = bus._dispatch

    def dispatch() -> None:
        real()  # returns once closing with nothing queued
        ended.set()
        go.wait(10)  # the window: _thread still names this (alive) thread

    bus._dispatch = dispatch  # type: ignore[method-assign]
    assert bus.publish(_event(1)) and bus.flush(5)
    thread = bus._thread
    closer = threading.Thread(target=bus.close, kwargs={"timeout": 0.2})
    closer.start()
    assert ended.wait(5)
    closer.join(5)  # close() stopped waiting (its timeout) with the thread still alive
    bus.open()  # as PawnQueue.setup() after a teardown
    assert bus.publish(_event(2))  # the old thread looks alive: no new one
    go.set()
    assert thread is not None
    thread.join(5)
    delivered = bus.flush(3)
    queued, dispatcher = len(bus._queue), bus._thread
    bus.close(timeout=5)  # no dispatcher left behind for later tests' thread checks
    assert delivered and got == ["1", "2"], (
        f"event 2 stayed queued: flush={delivered}, got={got}, queued={queued}, "
        f"dispatcher={dispatcher}")
    assert bus._thread is None or not bus._thread.is_alive()
