"""The listener's poll thread: claims at most ``min(free worker slots,
max_messages_per_poll)`` messages per poll and hands them to the handler pool.

A poll that found messages polls again at once; empty polls after one that found
messages back off exponentially up to ``polling.interval_seconds`` (before the first
message: that interval from the start); store errors are logged and retried with
backoff, never fatal. With an ``idle_timeout``, idleness (nothing found, nothing in
hand) for that long stops the listener.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from ..errors import LeaseLostError, PawnQueueError
from .handling import HandlerPool
from .inflight import InFlight
from .state import Shared

log = logging.getLogger("pawn_queue_sync.runtime.listen")

__all__ = ["Poller", "EMPTY_POLL_WAIT_S", "POLL_ERROR_WAIT_S", "POLL_ERROR_WAIT_MAX_S",
           "OUTAGE_IDLE_MIN_S"]

#: First pause after an empty poll (doubles up to ``polling.interval_seconds``).
EMPTY_POLL_WAIT_S = 0.1
#: First pause after a failed poll (doubles up to ``POLL_ERROR_WAIT_MAX_S``).
POLL_ERROR_WAIT_S = 0.5
POLL_ERROR_WAIT_MAX_S = 30.0
#: Failing polls end an idle-bounded run only once they have failed for this long (or
#: ``idle_timeout``, if longer): a passing blip must not end a drain that found nothing.
OUTAGE_IDLE_MIN_S = 10.0


def _call(fn: Callable[[Any], object], msg: Any) -> Exception | None:
    """``fn(msg)``; the exception it raised, or None."""
    try:
        fn(msg)
    except Exception as exc:
        return exc
    return None


class Poller:
    """The poll loop of one listener, on a thread of its own."""

    def __init__(self, shared: Shared, inflight: InFlight, pool: HandlerPool, *,
                 idle_timeout: float | None) -> None:
        self._s = shared
        self._inflight = inflight
        self._pool = pool
        self._idle_timeout = idle_timeout
        self._rng = random.Random()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name=f"pawnq-poll-{self._s.name}", daemon=True
        )
        self._thread.start()

    def join(self) -> None:
        """Wait for the loop to end (at most one poll in flight: store timeouts bound
        it)."""
        if self._thread is not None:
            self._thread.join()

    def _wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the shutdown to begin; True if it has."""
        s = self._s
        with s.cond:
            if not s.stopping and seconds > 0:
                s.wait(seconds)
            return s.stopping

    def _loop(self) -> None:
        s = self._s
        polling = s.polling
        max_empty_wait = max(polling.interval_seconds, EMPTY_POLL_WAIT_S)
        # The fast ramp follows the tail of a burst; before the first message there is
        # none to follow, so an idle start costs one listing per interval from the start.
        empty_wait = max_empty_wait
        error_wait = POLL_ERROR_WAIT_S
        idle_since: float | None = None
        try:
            while True:
                n, idle_at_reserve = self._inflight.reserve()
                if n == 0:
                    return
                started = s.clock.monotonic()
                try:
                    msgs = list(s.consumer.poll(n))
                except Exception as exc:  # never fatal: log, back off, poll again
                    self._inflight.unreserve(n)
                    with s.cond:
                        s.stats.poll_errors += 1
                        busy = self._inflight.live() > 0
                    log.warning("listener %s: poll failed (retrying in %.1f s): %s",
                                s.name, error_wait, exc,
                                exc_info=not isinstance(exc, PawnQueueError))
                    # A failing poll finds nothing either: a store down for idle_timeout
                    # ends an idle-bounded run (drain) rather than hang it forever.
                    idle_since, wait = self._idle_check(
                        busy, idle_since, started, error_wait, at_least=OUTAGE_IDLE_MIN_S)
                    if wait is None or self._wait(wait):
                        return
                    error_wait = min(error_wait * 2, POLL_ERROR_WAIT_MAX_S)
                    continue
                error_wait = POLL_ERROR_WAIT_S
                msgs = self._vet(msgs)
                self._inflight.unreserve(n - len(msgs))
                s.count(polls=1, claimed=len(msgs))
                if msgs:
                    idle_since = None
                    empty_wait = EMPTY_POLL_WAIT_S
                    self._pool.dispatch(msgs)
                    continue
                with s.cond:
                    s.stats.empty_polls += 1
                    # Only a poll that began with nothing in hand proves idleness: while
                    # our acks run, a listing may show messages that vanish before the
                    # claim, and such a poll comes back empty with more to come.
                    busy = self._inflight.live() > 0 or not idle_at_reserve
                wait = empty_wait + self._rng.uniform(0, polling.jitter_max_ms / 1000.0)
                idle_since, until = self._idle_check(busy, idle_since, started, wait)
                if until is None or self._wait(until):
                    return
                empty_wait = min(empty_wait * 2, max_empty_wait)
        except BaseException:
            log.exception("listener %s: poll thread crashed; stopping", s.name)
            s.request_stop()
            raise

    def _idle_check(
        self, busy: bool, idle_since: float | None, started: float, wait: float,
        at_least: float = 0.0,
    ) -> tuple[float | None, float | None]:
        """After a poll that found nothing (``started`` when it began): when idleness
        began, and how long to wait before the next poll; None once ``idle_timeout``
        (or ``at_least``, if longer) has passed with nothing in hand, having stopped
        the listener."""
        if self._idle_timeout is None:
            return idle_since, wait
        if busy:
            return None, wait
        idle_since = started if idle_since is None else idle_since
        timeout = max(self._idle_timeout, at_least)
        left = timeout - (self._s.clock.monotonic() - idle_since)
        if left <= 0:
            log.info("listener %s: idle for %.1f s%s", self._s.name, timeout,
                     " (polls failing)" if at_least else "")
            self._s.request_stop()
            return idle_since, None
        return idle_since, min(wait, left)

    def _vet(self, msgs: list[Any]) -> list[Any]:
        """Renew now any lease that aged during a slow poll (claims of one poll run in
        parallel and the poll returns when the slowest is done), so no handler starts
        on a lease that may have expired; drop those found lost. The renewals run
        together on the claim pool (idle once the poll has returned): one after
        another, the first renewed would age again while the last waited."""
        s = self._s
        consumer = s.consumer
        ctx = consumer.context
        fresh_for = min(s.polling.lease_refresh_interval_seconds,
                        ctx.visibility - ctx.fence_margin())
        aged = [m for m in msgs if consumer.lease_age(m) >= fresh_for]
        if not aged:
            return msgs
        errors: dict[str, Exception | None]
        if len(aged) == 1:
            errors = {aged[0].id: _call(consumer.refresh, aged[0])}
        else:
            pool = ctx.pool("claim", s.polling.claim_threads)
            futures = {m.id: pool.submit(_call, consumer.refresh, m) for m in aged}
            errors = {mid: f.result() for mid, f in futures.items()}
        kept: list[Any] = []
        for msg in msgs:
            exc = errors.get(msg.id)
            if isinstance(exc, LeaseLostError):
                s.count(lost=1)
                log.warning("lease on %s/%s expired during a slow poll; skipped",
                            msg.topic, msg.id)
                continue
            if exc is not None:  # keep it: the refresher tries again at once
                log.warning("could not renew %s/%s after a slow poll: %s", msg.topic,
                            msg.id, exc)
            kept.append(msg)
        return kept
