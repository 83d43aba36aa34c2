"""Keep leases alive while their messages are being worked on.

One daemon thread per consumer (or listener) renews every tracked lease once its
current version is ``interval`` seconds old, so a handler slower than the visibility
timeout keeps its message and nobody else receives it meanwhile. A lease is renewed
only when it is due: a message settled within ``interval`` costs no refresh request.

Messages are untracked when they are settled (``state != "leased"``), explicitly with
:meth:`LeaseRefresher.untrack`, or when their lease turns out to be lost: then
:meth:`~pawn_queue_sync.Consumer.refresh` has already set ``msg.state = "lost"``, which
the handler can check (``msg.done``), and acting on the message raises LeaseLostError.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import LeaseLostError, PawnQueueError

if TYPE_CHECKING:
    from ..queue.consumer import Consumer
    from ..queue.message import Message

log = logging.getLogger(__name__)

__all__ = ["LeaseRefresher"]

#: After a refresh failed for a transient reason, try again after at most this long.
_RETRY_AFTER_ERROR_S = 1.0


class LeaseRefresher:
    """Renews the leases of tracked messages every ``interval`` seconds on one thread.

    ``on_lost(msg)`` (optional) is called on the refresher thread when a lease was
    found taken over. ``start()`` and ``stop()`` are idempotent; ``stop()`` joins the
    thread, so none outlives it. Also a context manager (start on enter, stop on exit).
    """

    def __init__(
        self,
        consumer: Consumer,
        interval: float,
        *,
        name: str | None = None,
        on_lost: Callable[[Message], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        self._consumer = consumer
        self._interval = float(interval)
        self._clock = consumer.context.clock
        self._name = name or f"pawnq-refresher-{consumer.name}"
        self._on_lost = on_lost
        self._cond = threading.Condition()
        self._tracked: dict[str, Message] = {}
        #: message id -> monotonic time of its next refresh attempt
        self._due: dict[str, float] = {}
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        self.errors = 0
        self.lost = 0

    # -- tracking ----------------------------------------------------------------------

    def track(self, msg: Message) -> None:
        """Renew ``msg``'s lease from now on, until it is settled or untracked."""
        with self._cond:
            self._tracked[msg.id] = msg
            self._due[msg.id] = msg.lease_written_at + self._interval
            self._cond.notify()

    def untrack(self, msg: Message) -> None:
        """Stop renewing ``msg``'s lease (no-op if it is not tracked)."""
        with self._cond:
            if self._tracked.get(msg.id) is msg:
                del self._tracked[msg.id]
                self._due.pop(msg.id, None)

    def tracked(self) -> list[Message]:
        """The messages whose leases are being renewed."""
        with self._cond:
            return list(self._tracked.values())

    def __len__(self) -> int:
        with self._cond:
            return len(self._tracked)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> LeaseRefresher:
        """Start the thread (once)."""
        with self._cond:
            if self._thread is not None or self._stopped:
                return self
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop renewing and join the thread. Idempotent; safe before ``start()``.

        A refresh under way finishes first (bounded by the store's timeouts).
        """
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s did not stop within %.1f s", self._name, timeout or 0.0)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> LeaseRefresher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        log.debug("%s started (interval %.2f s)", self._name, self._interval)
        try:
            while True:
                due = self._wait_for_due()
                if due is None:
                    return
                for msg in due:
                    with self._cond:
                        if self._stopped:
                            return
                    self._refresh(msg)
        finally:
            log.debug("%s stopped", self._name)

    def _wait_for_due(self) -> list[Message] | None:
        """Block until some tracked lease is due (returned) or stop (None)."""
        with self._cond:
            while not self._stopped:
                self._forget_settled()
                now = self._clock.monotonic()
                due = [m for mid, m in self._tracked.items() if self._due[mid] <= now]
                if due:
                    due.sort(key=lambda m: self._due[m.id])
                    return due
                wait = min(self._due.values(), default=now + self._interval) - now
                self._cond.wait(max(wait, 0.001))
            return None

    def _forget_settled(self) -> None:
        for mid, msg in list(self._tracked.items()):
            if msg.state != "leased":
                del self._tracked[mid]
                self._due.pop(mid, None)

    def _refresh(self, msg: Message) -> None:
        if msg.state != "leased":
            self.untrack(msg)
            return
        try:
            self._consumer.refresh(msg)
        except LeaseLostError as exc:
            self.untrack(msg)
            if msg.state == "lost":
                self.lost += 1
                log.warning("lease on %s/%s lost: %s", msg.topic, msg.id, exc)
                if self._on_lost is not None:
                    try:
                        self._on_lost(msg)
                    except Exception:
                        log.exception("on_lost callback failed for %s", msg.id)
            return  # otherwise settled meanwhile: nothing to renew
        except Exception as exc:  # a transient store error must not end the thread
            self.errors += 1
            log.warning(
                "could not refresh lease on %s/%s (will retry): %s", msg.topic, msg.id, exc,
                exc_info=not isinstance(exc, PawnQueueError),
            )
            with self._cond:
                if self._tracked.get(msg.id) is msg:
                    retry_at = self._clock.monotonic() + min(_RETRY_AFTER_ERROR_S,
                                                             self._interval / 2)
                    self._due[msg.id] = retry_at
            return
        self.refreshes += 1
        with self._cond:
            if self._tracked.get(msg.id) is msg:
                self._due[msg.id] = msg.lease_written_at + self._interval
