"""Typed events of a queue's life (published, claimed, acked, ...) and the dispatcher
that hands them to callbacks off the hot path.

A :class:`PawnQueue <pawn_queue_sync.PawnQueue>` (``on_event=``) and each consumer
(``register_consumer(..., on_event=)``) may take a callback; the queue's code calls
:meth:`EventBus.publish`, which only appends the event to a bounded in-memory queue
(no I/O, no callback, never a wait). One daemon thread per bus and process calls the
callbacks, in the order the events were published. When the queue is full (callbacks
slower than the events come), an event is dropped and counted (:attr:`EventBus.dropped`)
rather than block a publish, a claim or an ack. A callback that raises is logged (at
most once a minute per bus, with the count of those not logged) and the next event
goes on: any exception, a BaseException too (``SystemExit`` from a ``sys.exit()``,
``KeyboardInterrupt`` raised by the callback itself), since the thread serves every
callback of the queue. Should the thread end anyway, the next event starts another.
In a forked child the bus starts empty (the parent's queued events are the parent's
to deliver) with a thread of its own, started by its first event there.
:meth:`EventBus.close` (``PawnQueue.teardown``) waits a bounded time for what is
queued, then stops the thread.

Base layer: no I/O, no import of the rest of the package.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Literal

import attrs

log = logging.getLogger(__name__)

EventKind = Literal["published", "claimed", "acked", "nacked", "retried", "lease_lost",
                    "dead_lettered", "redriven", "reaped", "poll_error"]
#: Every event kind, in the order of a message's life.
KINDS: tuple[str, ...] = ("published", "claimed", "acked", "nacked", "retried",
                          "lease_lost", "dead_lettered", "redriven", "reaped", "poll_error")

#: Events a bus keeps queued for its callbacks at most; more are dropped (counted).
DEFAULT_MAX_QUEUED = 10_000
#: Seconds ``close()`` waits by default for the queued events to be handed out.
DRAIN_TIMEOUT_S = 5.0
#: A raising callback is logged at most once per this many seconds per bus.
ERROR_LOG_INTERVAL_S = 60.0


def _check_kind(_instance: object, _attribute: object, value: str) -> None:
    if value not in KINDS:
        raise ValueError(f"unknown event kind {value!r}; one of {', '.join(KINDS)}")


@attrs.frozen
class Event:
    """Something that happened to a message (or a poll), as a callback receives it.

    ``message_id`` is None for ``poll_error``; for ``reaped`` on a packed topic it is
    the segment's id. ``duration`` (seconds): for ``published``, the publish call's time
    (a packed topic's includes the group commit); for ``acked``, ``nacked`` and
    ``retried``, the handler's run time under ``listen()``/``WorkerPool``/``drain``,
    else the time from the claim to the settlement; None otherwise. ``error``: the
    reason of a nack or dead letter, a retry's error, a poll's failure."""

    kind: str = attrs.field(validator=_check_kind)
    topic: str
    message_id: str | None
    at: datetime
    delivery_count: int | None = None
    duration: float | None = None
    consumer_id: str | None = None
    producer_id: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``at`` in ISO 8601."""
        doc = attrs.asdict(self)
        doc["at"] = self.at.isoformat()
        return doc


#: What ``on_event`` takes: called with each event on the dispatcher thread; its
#: return value is ignored.
EventCallback = Callable[[Event], object]

#: One queued item: the event, and a callback of its own (a consumer's) or None.
_Item = tuple[Event, "EventCallback | None"]


class EventBus:
    """Callbacks of one queue, and the bounded queue and thread that call them (see
    the module). Thread-safe; fork-safe."""

    def __init__(self, callbacks: Iterable[EventCallback] = (), *,
                 max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        if isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1:
            raise ValueError(f"max_queued must be an int >= 1, not {max_queued!r}")
        self._callbacks: tuple[EventCallback, ...] = ()
        self._max = max_queued
        #: events dropped because the queue was full (or the bus closed), this process
        self.dropped = 0
        #: callback calls that raised, this process
        self.errors = 0
        self._reset()
        for callback in callbacks:
            self.subscribe(callback)
        _BUSES.add(self)

    def _reset(self) -> None:
        """A fresh state for this process: no queued events, no thread."""
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # an event queued, or closing
        self._idle = threading.Condition(self._lock)  # the queue went empty
        self._queue: deque[_Item] = deque()
        self._busy = 0  # queued or being handed out
        self._thread: threading.Thread | None = None
        self._closing = False
        self._pid = os.getpid()
        self._logged_at = float("-inf")
        self._unlogged = 0

    def __repr__(self) -> str:
        return (f"EventBus(callbacks={len(self._callbacks)}, queued={len(self._queue)}, "
                f"dropped={self.dropped})")

    # -- callbacks ----------------------------------------------------------------------

    def subscribe(self, callback: EventCallback) -> None:
        """Call ``callback`` with every event of this bus from now on."""
        if not callable(callback):
            raise TypeError(f"on_event must be callable, not {type(callback).__name__}")
        with self._lock:
            self._callbacks = (*self._callbacks, callback)

    def unsubscribe(self, callback: EventCallback) -> None:
        """Stop calling ``callback`` (events already queued may still reach it)."""
        with self._lock:
            self._callbacks = tuple(c for c in self._callbacks if c is not callback)

    @property
    def active(self) -> bool:
        """Whether any callback listens (else events need not even be built)."""
        return bool(self._callbacks)

    # -- the hot path -------------------------------------------------------------------

    def publish(self, event: Event, also: EventCallback | None = None) -> bool:
        """Queue ``event`` for the callbacks (and ``also``, a consumer's); never blocks
        beyond a short lock. False when it was dropped: the queue full, or the bus
        closed."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            if self._closing or len(self._queue) >= self._max:
                self.dropped += 1
                return False
            self._queue.append((event, also))
            self._busy += 1
            if self._thread is None or not self._thread.is_alive():  # none, or it died
                self._thread = threading.Thread(target=self._run, name="pawnq-events",
                                                daemon=True)
                self._thread.start()
            self._ready.notify()
        return True

    # -- the dispatcher thread ----------------------------------------------------------

    def _run(self) -> None:
        try:
            self._dispatch()
        except BaseException:  # an abnormal end: the next publish starts another thread
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
            raise

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:  # closing, and everything handed out: the end is
                    # decided and recorded in one critical section, so an open() and a
                    # publish() after it start a new thread (they never see this one as
                    # the dispatcher while it ends)
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                event, also = self._queue.popleft()
                callbacks = self._callbacks
            try:
                for callback in (*callbacks, *((also,) if also is not None else ())):
                    self._call(callback, event)
            finally:
                with self._lock:
                    self._busy -= 1
                    if not self._busy:
                        self._idle.notify_all()

    def _call(self, callback: EventCallback, event: Event) -> None:
        try:
            callback(event)
        except BaseException as exc:  # a callback never stops the dispatcher, which
            # serves every callback: a SystemExit ends only this call
            self.errors += 1
            now = time.monotonic()
            if now - self._logged_at < ERROR_LOG_INTERVAL_S:
                self._unlogged += 1
                return
            more = f" ({self._unlogged} more not logged)" if self._unlogged else ""
            self._logged_at, self._unlogged = now, 0
            log.warning("on_event callback %r raised on a %s event: %s: %s%s", callback,
                        event.kind, type(exc).__name__, exc, more)

    # -- flushing and closing ---------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event queued so far has been handed to the callbacks (or
        ``timeout`` seconds); True if so."""
        with self._lock:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def close(self, timeout: float = DRAIN_TIMEOUT_S) -> bool:
        """Hand out what is queued for up to ``timeout`` seconds, then stop the thread
        (events published meanwhile, and those still queued then, are dropped and
        counted). True when everything queued was handed out. A later :meth:`open`
        takes events again."""
        with self._lock:
            self._closing = True
            self._ready.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            left = len(self._queue)
            if left:
                self.dropped += left
                self._busy -= left
                self._queue.clear()
                if not self._busy:
                    self._idle.notify_all()
            return left == 0

    def open(self) -> None:
        """Take events again after :meth:`close`."""
        with self._lock:
            self._closing = False

    def _after_fork(self) -> None:
        """In a forked child: the parent's queued events and thread are not ours."""
        closing = self._closing
        self._reset()
        self._closing = closing
        self.dropped = self.errors = 0


#: Every bus, so a forked child resets them (a lock held at the fork stays held).
_BUSES: weakref.WeakSet[EventBus] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for bus in list(_BUSES):
        bus._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)

__all__ = ["DEFAULT_MAX_QUEUED", "DRAIN_TIMEOUT_S", "KINDS", "Event", "EventBus",
           "EventCallback", "EventKind"]
