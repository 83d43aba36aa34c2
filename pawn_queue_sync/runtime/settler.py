"""The listener's settler thread: ack batches, the retry heap, and handlers past their
timeout.

Acks are batched into ``consumer.ack_many`` (flushed every ``ack_flush_interval``
seconds or ``ack_batch_size`` messages, and on stop: two DeleteObjects per batch
instead of two DELETEs per message); retries whose backoff has elapsed are recorded (a
message waiting for its retry keeps its lease but no worker); handlers running past
``handler_timeout_seconds`` are given up on (their leases no longer renewed). A failed
ack is retried after a store error only; any other exception is logged with its
traceback and the batch given up.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from typing import Any

from ..errors import LeaseLostError, StorageError
from .handling import HandlerPool
from .inflight import InFlight
from .state import Shared

log = logging.getLogger("pawn_queue_sync.runtime.listen")

__all__ = ["Settler", "ACK_ERROR_WAIT_S"]

#: Pause before retrying a failed ack batch (doubles up to 10 s).
ACK_ERROR_WAIT_S = 0.2


class Settler:
    """Owns the pending acks and the retry heap (under ``shared.cond``) and the thread
    that settles them."""

    def __init__(self, shared: Shared, inflight: InFlight, pool: HandlerPool, *,
                 ack_batch_size: int, ack_flush_interval: float) -> None:
        self._s = shared
        self._inflight = inflight
        self._pool = pool
        self._batch_size = ack_batch_size
        self._flush_interval = ack_flush_interval
        self._acks: list[Any] = []
        self._acks_since = 0.0
        self._ack_retry_at = 0.0
        self._ack_error_wait = ACK_ERROR_WAIT_S
        self._retries: list[tuple[float, int, Any, str]] = []
        self._seq = itertools.count()
        #: under the lock: the shutdown flushes everything; nothing is queued any more
        self.closing = False
        self._thread: threading.Thread | None = None

    # -- called from other threads ---------------------------------------------------------

    def queue_ack(self, msg: Any) -> None:
        """Ack ``msg`` with the next batch (at once, here, once the settler has closed)."""
        s = self._s
        with s.cond:
            if not self.closing:
                if not self._acks:
                    self._acks_since = s.clock.monotonic()
                self._acks.append(msg)
                if len(self._acks) >= self._batch_size:
                    s.cond.notify_all()
                return
        self.ack([msg], requeue=False)  # the settler is gone: ack right here

    def schedule_retry(self, msg: Any, delay: float, error: str) -> bool:
        """Count a failed handler call and record its retry after ``delay`` seconds;
        False (counted, not scheduled) once closing: the caller retries at once."""
        s = self._s
        with s.cond:
            s.stats.failed += 1
            if self.closing:
                return False
            heapq.heappush(self._retries,
                           (s.clock.monotonic() + delay, next(self._seq), msg, error))
            s.cond.notify_all()
            return True

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name=f"pawnq-settler-{self._s.name}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Flush pending acks, record pending retries at once, and join the thread."""
        with self._s.cond:
            self.closing = True
            self._s.cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # -- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                acks, retries, overdue, done = self._next_settlements()
                if overdue:
                    self._abandon(overdue)
                if acks:
                    self.ack(acks)
                for msg, error in retries:
                    self._pool.retry(msg, error)
                    self._inflight.finish()
                if done:
                    return
        except BaseException:
            log.exception("listener %s: settler thread crashed; stopping", self._s.name)
            self._s.request_stop()
            raise

    def _next_settlements(
        self,
    ) -> tuple[list[Any], list[tuple[Any, str]], list[tuple[Any, float, bool]], bool]:
        """Block until acks or retries are due, or handlers past their timeout need a
        look; the bool says the settler may exit."""
        s = self._s
        with s.cond:
            while True:
                now = s.clock.monotonic()
                overdue, next_check = self._inflight.overdue(now)
                closing = self.closing
                acks: list[Any] = []
                if self._acks and now >= self._ack_retry_at and (
                    closing
                    or len(self._acks) >= self._batch_size
                    or now - self._acks_since >= self._flush_interval
                ):
                    acks = self._acks[: self._batch_size]
                    del self._acks[: self._batch_size]
                    self._acks_since = now
                retries: list[tuple[Any, str]] = []
                while self._retries and (closing or self._retries[0][0] <= now):
                    _, _, msg, error = heapq.heappop(self._retries)
                    retries.append((msg, error))
                if acks or retries or overdue:
                    return acks, retries, overdue, False
                if closing and not self._acks:
                    return [], [], [], True
                timeouts = []
                if next_check is not None:
                    timeouts.append(next_check - now)
                if self._acks:
                    timeouts.append(max(self._acks_since + self._flush_interval,
                                        self._ack_retry_at) - now)
                if self._retries:
                    timeouts.append(self._retries[0][0] - now)
                s.wait(max(min(timeouts), 0.001) if timeouts else None)

    def _abandon(self, overdue: list[tuple[Any, float, bool]]) -> None:
        """Stop renewing the leases of handlers past their timeout, and say so; the
        leases expire and the messages are delivered again."""
        s = self._s
        with s.cond:
            stuck = s.stats.stuck
        timeout = self._inflight.handler_timeout
        for msg, ran, first in overdue:
            if first:
                s.refresher.untrack(msg)  # waits for a renewal of it under way
                log.warning(
                    "listener %s: handler on %s/%s has run for %.1f s, past "
                    "handler_timeout_seconds=%g; its lease is no longer renewed and will "
                    "expire, then the message is delivered again (the thread cannot be "
                    "stopped and keeps its worker slot: %d of %d stuck)", s.name,
                    msg.topic, msg.id, ran, timeout, stuck, s.max_workers)
            else:
                log.warning(
                    "listener %s: handler on %s/%s still running after %.1f s (past "
                    "handler_timeout_seconds=%g; %d of %d worker slot(s) stuck)",
                    s.name, msg.topic, msg.id, ran, timeout, stuck, s.max_workers)

    def ack(self, msgs: list[Any], *, requeue: bool = True) -> None:
        """Ack a batch; each message is finished unless kept for another attempt.

        The batch leaves the refresher first (a refresh under way is waited for): a
        refresh landing after the ack deleted the lease would find it gone and turn
        the acked message into a lost one. ``ack_many`` re-proves any lease too old
        for its fence itself. Only a message the ack did delete counts as processed.

        A store error keeps the batch for another attempt after a pause (given up at
        stop). Any other exception is a bug (ours, the store's, a wrapper's) that would
        recur on every attempt, so that nothing ever went idle: it is logged with its
        traceback and the batch given up at once. Messages it left leased are not
        released (their handlers would run again at once, and the ack fail again): their
        leases are no longer renewed and expire, and they are delivered again (``lost``).
        """
        s = self._s
        for msg in msgs:
            s.refresher.untrack(msg)
        kept: list[Any] = []
        try:
            s.consumer.ack_many(msgs)
        except LeaseLostError as exc:
            log.warning("listener %s: %s", s.name, exc)
        except StorageError as exc:
            with s.cond:
                s.stats.ack_errors += 1
                if requeue and (not self.closing or self._ack_error_wait < 5.0):
                    # keep them (leases renewed again) and try again after a pause
                    kept = [m for m in msgs if m.state == "leased"]
                    for msg in kept:
                        s.refresher.track(msg)
                    self._acks[:0] = kept
                    self._ack_retry_at = s.clock.monotonic() + self._ack_error_wait
                    self._ack_error_wait = min(self._ack_error_wait * 2, 10.0)
                    log.warning("listener %s: ack of %d message(s) failed, retrying: %s",
                                s.name, len(msgs), exc)
                else:
                    log.error("listener %s: giving up acking %d message(s); they will be "
                              "redelivered: %s", s.name, len(msgs), exc)
        except Exception:
            s.count(ack_errors=1)
            log.exception("listener %s: unexpected error acking %d message(s), not "
                          "retried; those not acked will be redelivered once their leases "
                          "expire", s.name, len(msgs))
        else:
            self._ack_error_wait = ACK_ERROR_WAIT_S
            s.count(ack_batches=1)
        for msg in msgs:
            if msg in kept:
                continue
            if msg.state == "acked":
                s.count(processed=1)
            elif msg.state == "lost":
                self._pool.count_lost(msg, "before its ack")
            elif msg.state == "leased":  # refused (not provably ours) or given up
                s.count(lost=1)
                log.warning("listener %s: %s/%s was not acked; its lease will expire and "
                            "it will be redelivered", s.name, msg.topic, msg.id)
            self._inflight.finish()
