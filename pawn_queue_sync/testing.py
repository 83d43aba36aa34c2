"""Unit-test message handlers without a server, as dramatiq's ``StubBroker`` allows.

:func:`memory_queue` is a started :class:`~pawn_queue_sync.PawnQueue` over an in-memory
store whose time is a :class:`~pawn_queue_sync.clock.FakeClock` in auto mode: leases,
visibility timeouts, retry backoffs and idle timeouts all run in virtual time, so a
handler retried with a 30 s backoff is dead-lettered in milliseconds. The queue behaves
as on S3 (same claims, leases, acks, dead-letter); only the store and the clock differ.

    from pawn_queue_sync.testing import memory_queue, run_handler

    def handle(msg):
        if msg.payload["n"] < 0:
            raise ValueError("negative")

    with memory_queue(topics=["orders"]) as pq:
        pq.register_producer("shop").publish_batch("orders", [{"n": 1}, {"n": -1}])
        result = run_handler(pq, "orders", handle)
        assert result.processed == 1 and result.dead_lettered == 1

Handlers that simulate slow work should sleep on the queue's clock
(``pq.context.clock.sleep(s)``, virtual), not with ``time.sleep`` (real).

``memory_queue(clock=FakeClock())`` (a *manual* clock) is for tests that move time
themselves: a listener's or ``run_handler``'s timeouts (idle timeout, retry backoffs,
ack flushes, the shutdown wait) then elapse only as the test calls
``clock.advance(seconds)``; nothing moves it otherwise, so ``run_handler`` does not
return until the test advances the clock past its idle timeout (the clock logs a
warning when a wait has stood still for ``stall_warning_seconds`` of real time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .clock import FakeClock
from .config import load_config
from .queue.core import PawnQueue
from .runtime import DrainResult, Handler, drain
from .storage.memory import Hook, MemoryStore

__all__ = ["FakeClock", "MemoryStore", "memory_queue", "run_handler"]


def memory_queue(
    config: Mapping[str, Any] | None = None,
    *,
    topics: Sequence[str] = (),
    clock: FakeClock | None = None,
    hooks: Hook | None = None,
) -> PawnQueue:
    """A started queue over a fresh :class:`MemoryStore`, on ``clock`` (default: a new
    ``FakeClock(auto=True)``), with ``topics`` created. ``config``: settings as a dict
    (e.g. ``{"polling": {"max_delivery_count": 3}}``); the store is always the memory
    store. ``hooks(op, key)``, called before each store operation, may raise a
    :class:`~pawn_queue_sync.StorageError` to inject a fault (or sleep on ``clock`` to
    slow the store down). Close the queue (or use ``with``) when done: that also
    closes the clock made here (not one passed in). With a manual clock
    (``FakeClock()``), timeouts elapse only as the test advances it (see above)."""
    if clock is None:
        pq: PawnQueue = _ClockOwningQueue(config, hooks, FakeClock(auto=True))
    else:
        pq = PawnQueue(load_config(dict(config or {})),
                       store=MemoryStore(clock, hooks=hooks), clock=clock)
    try:
        pq.setup()
        for topic in topics:
            pq.create_topic(topic)
    except BaseException:
        pq.close()
        raise
    return pq


class _ClockOwningQueue(PawnQueue):
    """A memory queue on a clock of its own, which ``close()`` closes after the queue
    (its ``fake-clock`` thread, if running, is joined): nothing left running."""

    def __init__(self, config: Mapping[str, Any] | None, hooks: Hook | None,
                 clock: FakeClock) -> None:
        super().__init__(load_config(dict(config or {})),
                         store=MemoryStore(clock, hooks=hooks), clock=clock)
        self._own_clock = clock

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self._own_clock.close()

    close = teardown


def run_handler(
    pq: PawnQueue,
    topics: str | Sequence[str],
    handler: Handler,
    *,
    consumer_name: str = "test",
    threads: int = 1,
    **drain_options: Any,
) -> DrainResult:
    """Deliver what ``topics`` hold to ``handler`` until they are idle (as
    :func:`~pawn_queue_sync.drain` does, retries and dead-letters included) and return
    the counts. ``drain_options``: ``max_messages``, ``idle_timeout_seconds``,
    ``handler_timeout_seconds``."""
    names = [topics] if isinstance(topics, str) else list(topics)
    consumer = pq.register_consumer(consumer_name, names)
    return drain(consumer, handler, threads=threads, **drain_options)
