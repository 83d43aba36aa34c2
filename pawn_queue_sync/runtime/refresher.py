"""Keep leases alive while their messages are being worked on.

A refresher renews every tracked lease once its current version is
``interval_seconds`` old, so a handler slower than the visibility timeout keeps its message and
nobody else receives it meanwhile. A lease is renewed only when it is due: a message
settled within that interval costs no refresh request.

Renewals run on up to ``threads`` threads (``polling.claim_threads`` by default),
started as leases are tracked, and the due lease closest to expiry goes first. One
thread would not do: a refresh is a request (0.2-0.3 s on a loaded store), and on a
server without If-Match it also sleeps ``2 x jitter_min_ms``; a listener may hold
``max_workers + ack_batch_size`` leases, so renewing them one after another takes
longer than a visibility timeout, and then other consumers take messages whose
handlers are still running. A renewal taken up late (more than one interval after it
fell due, or past the ack fence) is counted in :attr:`LeaseRefresher.late` and logged
as a warning, at most once per interval.

Messages are untracked when they are settled (``state != "leased"``), explicitly with
:meth:`LeaseRefresher.untrack` (which waits for a renewal of that message under way,
so a caller about to ack or release it never races a refresh), or when their lease
turns out to be lost: then :meth:`~pawn_queue_sync.Consumer.refresh` has already set
``msg.state = "lost"``, which the handler can check (``msg.done``), and acting on the
message raises LeaseLostError.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

from ..errors import LeaseLostError, PawnQueueError
from .options import renamed
from .ports import ConsumerPort

#: a claimed message (see :class:`~.ports.MessagePort`)
Message = Any

log = logging.getLogger(__name__)

__all__ = ["LeaseRefresher"]

#: After a refresh failed for a transient reason, try again after at most this long.
_RETRY_AFTER_ERROR_S = 1.0

_Outcome = Literal["renewed", "skipped", "lost", "settled", "error"]


class LeaseRefresher:
    """Renews the leases of tracked messages every ``interval_seconds``, on up to
    ``threads`` threads (default ``polling.claim_threads``), closest to expiry first.

    ``on_lost(msg)`` (optional) is called on a refresher thread when a lease was found
    taken over. ``start()`` and ``stop()`` are idempotent; ``stop()`` joins every
    thread, so none outlives it. Also a context manager (start on enter, stop on exit).
    """

    def __init__(
        self,
        consumer: ConsumerPort,
        interval_seconds: float | None = None,
        *,
        name: str | None = None,
        on_lost: Callable[[Message], None] | None = None,
        threads: int | None = None,
        **deprecated: float,
    ) -> None:
        """``interval_seconds``: renew a lease once it is this old (``interval=`` is
        its deprecated alias)."""
        interval = _interval_seconds(interval_seconds, deprecated)
        if not interval > 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval!r}")
        ctx = consumer.context
        if threads is None:
            threads = ctx.config.polling.claim_threads
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        self._consumer = consumer
        self._interval = float(interval)
        self._max_threads = threads
        self._clock = ctx.clock
        self._visibility = ctx.visibility
        self._late_after = _late_after(self._interval, ctx.visibility,
                                       ctx.visibility - ctx.fence_margin())
        self._name = name or f"pawnq-refresher-{consumer.name}"
        self._on_lost = on_lost
        self._lock = threading.Lock()
        #: wakes a thread waiting for a lease to fall due (tracked, stopped)
        self._cond = threading.Condition(self._lock)
        #: wakes callers of untrack() waiting for a renewal under way to finish
        self._idle = threading.Condition(self._lock)
        self._tracked: dict[str, Message] = {}
        #: message id -> monotonic time of its next refresh attempt
        self._due: dict[str, float] = {}
        #: message id -> the thread renewing it right now
        self._busy: dict[str, threading.Thread] = {}
        self._started = False
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._late_unreported = 0
        self._worst_age = 0.0
        self._warned_at: float | None = None
        self.refreshes = 0
        self.errors = 0
        self.lost = 0
        #: renewals taken up late (see the module docstring): the refresher fell behind
        self.late = 0

    # -- tracking ----------------------------------------------------------------------

    def track(self, msg: Message) -> None:
        """Renew ``msg``'s lease from now on, until it is settled or untracked."""
        with self._lock:
            self._tracked[msg.id] = msg
            self._due[msg.id] = msg.lease_written_at + self._interval
            self._spawn_if_needed()
            self._cond.notify()

    def untrack(self, msg: Message) -> None:
        """Stop renewing ``msg``'s lease (no-op if it is not tracked). A renewal of it
        under way is waited for (except on the refresher's own thread), so once this
        returns no refresh of ``msg`` is in flight: an ack or release that follows
        never has a refresh land after it deleted the lease."""
        with self._lock:
            if self._tracked.get(msg.id) is msg:
                del self._tracked[msg.id]
                self._due.pop(msg.id, None)
            me = threading.current_thread()
            while self._busy.get(msg.id) not in (None, me):
                self._idle.wait()

    def tracked(self) -> list[Message]:
        """The messages whose leases are being renewed."""
        with self._lock:
            return list(self._tracked.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._tracked)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> LeaseRefresher:
        """Start renewing (once): a first thread now, more as leases are tracked."""
        with self._lock:
            if self._started or self._stopped:
                return self
            self._started = True
            self._spawn()
            self._spawn_if_needed()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop renewing and join every thread. Idempotent; safe before ``start()``.

        Refreshes under way finish first (bounded by the store's timeouts).
        """
        with self._lock:
            self._stopped = True
            self._cond.notify_all()
            threads = list(self._threads)
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        me = threading.current_thread()
        for thread in threads:
            if thread is me:
                continue
            left = None if deadline is None else max(deadline - self._clock.monotonic(), 0)
            thread.join(left)
            if thread.is_alive():
                log.warning("%s did not stop within %.1f s", thread.name, timeout or 0.0)

    @property
    def alive(self) -> bool:
        """True while any of its threads runs."""
        with self._lock:
            return any(t.is_alive() for t in self._threads)

    def __enter__(self) -> LeaseRefresher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the threads -------------------------------------------------------------------

    def _spawn_if_needed(self) -> None:
        """(Under the lock.) One thread per tracked lease, up to the limit."""
        if not self._started or self._stopped:
            return
        while len(self._threads) < min(self._max_threads, len(self._tracked)):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        log.debug("%s started (interval %.2f s)", threading.current_thread().name,
                  self._interval)
        try:
            while True:
                msg = self._next_due()
                if msg is None:
                    return
                self._renew(msg)
        finally:
            log.debug("%s stopped", threading.current_thread().name)

    def _next_due(self) -> Message | None:
        """Block until some tracked lease nobody is renewing is due, and take the one
        closest to expiry (None on stop)."""
        with self._lock:
            while not self._stopped:
                self._forget_settled()
                now = self._clock.monotonic()
                pick: Message | None = None
                next_due: float | None = None
                for mid, msg in self._tracked.items():
                    if mid in self._busy:
                        continue
                    due = self._due[mid]
                    if due <= now:
                        if pick is None or msg.lease_written_at < pick.lease_written_at:
                            pick = msg
                    elif next_due is None or due < next_due:
                        next_due = due
                if pick is not None:
                    self._busy[pick.id] = threading.current_thread()
                    self._note_lateness(pick, now)
                    return pick
                self._clock.wait(self._cond,
                                 None if next_due is None else max(next_due - now, 0.001))
            return None

    def _forget_settled(self) -> None:
        for mid, msg in list(self._tracked.items()):
            if msg.state != "leased" and mid not in self._busy:
                del self._tracked[mid]
                self._due.pop(mid, None)

    def _note_lateness(self, msg: Message, now: float) -> None:
        """(Under the lock.) Count a renewal taken up late; warn at most once per
        interval, saying how far behind and what to change."""
        age = now - msg.lease_written_at
        if age <= self._late_after:
            return
        self.late += 1
        self._late_unreported += 1
        self._worst_age = max(self._worst_age, age)
        if self._warned_at is not None and now - self._warned_at < self._interval:
            return
        log.warning(
            "%s is behind: %d lease renewal(s) taken up late, the oldest lease %.1f s "
            "old (renewed every %.1f s, stale after %.1f s); %d lease(s) held, renewed "
            "on %d thread(s). Raise polling.claim_threads, or hold fewer messages.",
            self._name, self._late_unreported, self._worst_age, self._interval,
            self._visibility, len(self._tracked), len(self._threads),
        )
        self._warned_at = now
        self._late_unreported = 0
        self._worst_age = 0.0

    def _renew(self, msg: Message) -> None:
        outcome: _Outcome
        error: Exception | None = None
        token = msg.lease_token
        try:
            self._consumer.refresh(msg)
        except LeaseLostError as exc:
            # lost if refresh() found another lease; otherwise settled meanwhile
            outcome = "lost" if msg.state == "lost" else "settled"
            error = exc
        except Exception as exc:  # a transient store error must not end the thread
            outcome, error = "error", exc
        else:
            # refresh() writes nothing while an ack of the message is under way (or
            # after it): look again shortly rather than at once, so as not to spin
            outcome = "renewed" if msg.lease_token != token else "skipped"
        with self._lock:
            del self._busy[msg.id]
            mine = self._tracked.get(msg.id) is msg
            if outcome == "renewed":
                self.refreshes += 1
                if mine:
                    self._due[msg.id] = msg.lease_written_at + self._interval
            elif outcome == "skipped":
                if mine and msg.state == "leased":
                    self._due[msg.id] = self._clock.monotonic() + min(
                        _RETRY_AFTER_ERROR_S, self._interval / 2)
                elif mine:
                    del self._tracked[msg.id]
                    self._due.pop(msg.id, None)
            elif outcome == "error":
                self.errors += 1
                if mine:
                    self._due[msg.id] = self._clock.monotonic() + min(
                        _RETRY_AFTER_ERROR_S, self._interval / 2)
            else:
                if outcome == "lost":
                    self.lost += 1
                if mine:
                    del self._tracked[msg.id]
                    self._due.pop(msg.id, None)
            self._idle.notify_all()
        if outcome == "error":
            log.warning(
                "could not refresh lease on %s/%s (will retry): %s", msg.topic, msg.id, error,
                exc_info=not isinstance(error, PawnQueueError),
            )
        elif outcome == "lost":
            log.warning("lease on %s/%s lost: %s", msg.topic, msg.id, error)
            if self._on_lost is not None:
                try:
                    self._on_lost(msg)
                except Exception:
                    log.exception("on_lost callback failed for %s", msg.id)


def _interval_seconds(given: float | None, deprecated: dict[str, float]) -> float:
    """``interval_seconds``, or its deprecated alias ``interval`` (which warns)."""
    unknown = sorted(set(deprecated) - {"interval"})
    if unknown:
        raise TypeError(f"LeaseRefresher() got an unexpected keyword argument "
                        f"{unknown[0]!r}")
    if given is not None:
        deprecated = {**deprecated, "interval_seconds": given}
    names = renamed(deprecated, {"interval": "interval_seconds"}, stacklevel=4)
    if "interval_seconds" not in names:
        raise TypeError("LeaseRefresher() missing required argument 'interval_seconds'")
    return names["interval_seconds"]


def _late_after(interval: float, visibility: float, fence: float) -> float:
    """The lease age past which a renewal counts as late: one interval past due, or
    past the ack fence (``visibility - margin``), whichever comes first. When the
    interval is not below the fence (short test leases), halfway from due to stale
    stands in for the fence."""
    fence_age = fence if fence > interval else (interval + visibility) / 2
    return min(2 * interval, fence_age)
