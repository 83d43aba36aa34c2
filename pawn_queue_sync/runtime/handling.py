"""The listener's handler pool: ``max_workers`` threads run the handler on claimed
messages, and what becomes of each message (ack queued, retry scheduled, dead-letter,
release, loss) is decided here.

Returns -> ack (unless the handler settled the message itself); raises -> retried
after an exponential, capped backoff via ``consumer.retry`` (which records the attempt
in the message), or dead-lettered with the error once ``delivery_count`` reaches
``polling.max_delivery_count``. Every message leaves the lease refresher before its
ack, dead-letter, retry or release (a refresh under way is waited for).
"""

from __future__ import annotations

import contextlib
import logging
import random
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import LeaseLostError, PawnQueueError
from .inflight import InFlight
from .ports import Handler
from .state import Shared, describe_error

if TYPE_CHECKING:
    from .settler import Settler

log = logging.getLogger("pawn_queue_sync.runtime.listen")

__all__ = ["HandlerPool"]


class HandlerPool:
    """Runs the handler on a thread pool and settles each message's outcome."""

    def __init__(self, shared: Shared, inflight: InFlight, handler: Handler, *,
                 retry_backoff: float, retry_backoff_max: float) -> None:
        self._s = shared
        self._inflight = inflight
        self._handler = handler
        self._retry_backoff = retry_backoff
        self._retry_backoff_max = retry_backoff_max
        self._rng = random.Random()
        #: submitted and not done: future -> its message (under ``shared.cond``)
        self.futures: dict[Future[None], Any] = {}
        self.settler: Settler | None = None  # set by the listener before start()
        self._executor: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=self._s.max_workers,
            thread_name_prefix=f"pawnq-handler-{self._s.name}",
        )

    def shutdown(self, wait: bool) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)

    # -- submitting ----------------------------------------------------------------------------

    def dispatch(self, msgs: list[Any]) -> None:
        """Submit claimed messages (their slots are already taken)."""
        s = self._s
        for msg in msgs:
            s.refresher.track(msg)
        late: list[Any] = []
        with s.cond:
            if s.stopping:
                late = msgs
                self._inflight.slots_freed(len(msgs))
            else:
                assert self._executor is not None
                for msg in msgs:
                    fut = self._executor.submit(self._work, msg)
                    self.futures[fut] = msg
                    fut.add_done_callback(self._done)
        for msg in late:  # claimed while the shutdown began: give back at once
            self.release(msg)
            self._inflight.finish()

    def _done(self, fut: Future[None]) -> None:
        """Done-callback: free the slot; a cancelled (unstarted) message is released."""
        with self._s.cond:
            msg = self.futures.pop(fut, None)
            self._inflight.slots_freed()
        if msg is None:
            return
        if fut.cancelled():
            self.release(msg)
            self._inflight.finish()
            return
        exc = fut.exception()
        if exc is not None:  # a bug in this module, not in the handler
            log.error("listener %s: worker failed on %s", self._s.name, msg.id,
                      exc_info=(type(exc), exc, exc.__traceback__))

    # -- handler threads -----------------------------------------------------------------------

    def _work(self, msg: Any) -> None:
        kept = False
        try:
            if self._s.stopping:
                self.release(msg)
            elif msg.state != "leased":
                self.count_lost(msg, "before its handler started")
            else:
                kept = self._handle(msg)
        finally:
            if not kept:
                self._inflight.finish()

    def _handle(self, msg: Any) -> bool:
        """Run the handler and settle; True if the message was handed to the settler
        (ack queued or retry scheduled), which then finishes it."""
        s = self._s
        self._inflight.begin_run(msg)
        started = s.clock.monotonic()
        try:
            self._handler(msg)
        except Exception as exc:
            late = self._inflight.end_run(msg)
            _ran(msg, s.clock.monotonic() - started)
            return self._on_failure(msg, exc, late=late)
        except BaseException:
            self._inflight.end_run(msg)
            self.release(msg)
            raise
        self._inflight.end_run(msg)
        _ran(msg, s.clock.monotonic() - started)
        state = msg.state
        if state == "leased":
            assert self.settler is not None
            self.settler.queue_ack(msg)  # counted processed once the ack has succeeded
            return True
        if state == "lost":
            self.count_lost(msg, "while its handler ran")
        else:  # the handler acked, nacked or released it itself
            s.refresher.untrack(msg)
            with s.cond:
                if state == "acked":
                    s.stats.processed += 1
                elif state == "nacked":
                    s.stats.dead_lettered += 1
                else:
                    s.stats.released += 1
        return False

    def _on_failure(self, msg: Any, exc: Exception, *, late: bool = False) -> bool:
        s = self._s
        if msg.state != "leased":
            if msg.state == "lost":
                self.count_lost(msg, "while its handler ran")
            else:
                s.refresher.untrack(msg)
            log.warning("handler failed on %s/%s, already %s: %s", msg.topic, msg.id,
                        msg.state, exc)
            return False
        error = describe_error(exc)
        most = s.polling.max_delivery_count
        if msg.delivery_count >= most:
            self._dead_letter(msg, error)
            return False
        if late:  # its lease is no longer renewed: record the attempt now, no backoff
            log.info("handler failed on %s/%s (delivery %d of %d) past its timeout: %s",
                     msg.topic, msg.id, msg.delivery_count, most, exc)
            s.count(failed=1)
            self.retry(msg, error)
            return False
        delay = min(self._retry_backoff * 2 ** (msg.delivery_count - 1),
                    self._retry_backoff_max)
        delay *= self._rng.uniform(0.9, 1.1)
        log.info("handler failed on %s/%s (delivery %d of %d), retry in %.1f s: %s",
                 msg.topic, msg.id, msg.delivery_count, most, delay, exc)
        assert self.settler is not None
        if self.settler.schedule_retry(msg, delay, error):
            return True
        self.retry(msg, error)  # shutting down: no backoff
        return False

    # -- outcomes ------------------------------------------------------------------------------

    def _dead_letter(self, msg: Any, error: str) -> None:
        s = self._s
        s.refresher.untrack(msg)  # no refresh in flight while the lease is deleted
        try:
            s.consumer.nack(msg, reason=error)
        except LeaseLostError:
            self.count_lost(msg, "before it could be dead-lettered")
            return
        except Exception as exc:
            log.error("could not dead-letter %s/%s (releasing it): %s", msg.topic, msg.id,
                      exc, exc_info=not isinstance(exc, PawnQueueError))
            self.release(msg)
            return
        finally:
            s.refresher.untrack(msg)
        s.count(dead_lettered=1)
        log.warning("dead-lettered %s/%s after %d deliveries: %s", msg.topic, msg.id,
                    msg.delivery_count, error.splitlines()[0])

    def retry(self, msg: Any, error: str) -> None:
        """Record the failed attempt in the message and give it back."""
        s = self._s
        s.refresher.untrack(msg)  # no refresh in flight while the lease is deleted
        if msg.state == "lost":  # taken over while waiting for its retry
            self.count_lost(msg, "while waiting for its retry")
            return
        try:
            s.consumer.retry(msg, error)
        except LeaseLostError:
            self.count_lost(msg, "before its retry was recorded")
        except Exception as exc:
            log.warning("could not record the failed attempt on %s/%s (releasing): %s",
                        msg.topic, msg.id, exc, exc_info=not isinstance(exc, PawnQueueError))
            self.release(msg)
        finally:
            s.refresher.untrack(msg)

    def release(self, msg: Any) -> None:
        """Give the message back unhandled (its lease deleted)."""
        s = self._s
        s.refresher.untrack(msg)
        try:
            s.consumer.release(msg)
        except Exception as exc:  # its lease will expire and it will be redelivered
            log.warning("could not release %s/%s: %s", msg.topic, msg.id, exc,
                        exc_info=not isinstance(exc, PawnQueueError))
            return
        s.count(released=1)

    def count_lost(self, msg: Any, when: str) -> None:
        self._s.refresher.untrack(msg)
        self._s.count(lost=1)
        log.warning("lease on %s/%s was lost %s; it will be redelivered", msg.topic, msg.id,
                    when)


def _ran(msg: Any, seconds: float) -> None:
    """Record the handler's run time on ``msg`` (its settlement's event reports it);
    a message type without the field is left as it is."""
    with contextlib.suppress(AttributeError):
        msg.handler_seconds = seconds
