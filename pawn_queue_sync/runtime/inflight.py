"""The listener's bounded in-flight counter, in the manner of s3transfer's
``BoundedExecutor``: worker slots and messages in hand, and the handler calls under
way (watched for ``handler_timeout_seconds``).

A slot is taken before a message is claimed and given back by its future's
done-callback, so claimed but unstarted messages never outnumber idle workers; at most
``capacity`` (``max_workers + ack_batch_size``) messages are in hand at once: being
claimed, queued or running, or waiting for their ack or retry.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from .state import Shared

log = logging.getLogger("pawn_queue_sync.runtime.listen")

__all__ = ["InFlight", "Run"]


@attrs.define(eq=False)
class Run:
    """A handler call under way: when it began, when to look at it next, and whether
    it has run past the handler timeout."""

    started: float
    check_at: float
    timed_out: bool = False


class InFlight:
    """Free worker slots, messages in hand, and handler calls under way; all under
    ``shared.cond``."""

    def __init__(self, shared: Shared, *, capacity: int, max_messages: int | None,
                 poll_coalesce: float, handler_timeout: float | None) -> None:
        self._s = shared
        self.free = shared.max_workers
        #: messages in hand; never more than ``capacity``
        self.held = 0
        self.capacity = capacity
        self.claimed = 0  # toward max_messages
        self.max_messages = max_messages
        self.poll_coalesce = poll_coalesce
        self.handler_timeout = handler_timeout
        #: handler calls under way, watched by the settler for the timeout
        self.running: dict[Any, Run] = {}

    def live(self) -> int:
        """(Under the lock.) Messages in hand that keep the listener busy: all but those
        whose handlers ran past their timeout (given up on; they may never return)."""
        return self.held - self._s.stats.stuck

    # -- slots ---------------------------------------------------------------------------------

    def reserve(self) -> tuple[int, bool]:
        """Take free worker slots for the next poll (0 when it is time to stop), and
        whether nothing was in hand as the poll begins (only then does an empty poll
        prove idleness)."""
        s = self._s
        per_poll = s.polling.max_messages_per_poll
        coalesce_until: float | None = None
        with s.cond:
            while True:
                if s.stopping:
                    return 0, False
                budget = (
                    per_poll if self.max_messages is None
                    else self.max_messages - self.claimed
                )
                room = self.capacity - self.held
                if budget <= 0:
                    if self.live() == 0:
                        log.info("listener %s: handled max_messages=%d", s.name,
                                 self.max_messages)
                        s.request_stop()
                        return 0, False
                elif self.free > 0 and room > 0:
                    n = min(self.free, per_poll, budget, room)
                    full = min(s.max_workers, per_poll, budget, room)
                    if n < (full + 1) // 2 and self.poll_coalesce > 0:
                        # few slots free: wait a moment for more, so one poll (two
                        # LISTs) serves several messages instead of one
                        now = s.clock.monotonic()
                        if coalesce_until is None:
                            coalesce_until = now + self.poll_coalesce
                        if now < coalesce_until:
                            s.wait(coalesce_until - now)
                            continue
                    idle = self.live() == 0
                    self.free -= n
                    self.held += n
                    self.claimed += n
                    return n, idle
                s.wait(None)

    def unreserve(self, n: int) -> None:
        """Give back slots taken for messages a poll did not bring."""
        if n:
            with self._s.cond:
                self.free += n
                self.held -= n
                self.claimed -= n
                self._s.cond.notify_all()

    def slots_freed(self, n: int = 1) -> None:
        """(Under the lock.) Worker slots free again (a handler call ended, or messages
        were never submitted)."""
        self.free += n
        self._s.cond.notify_all()

    def finish(self) -> None:
        """One message in hand is settled (acked, dead-lettered, retried, released or
        lost): it no longer counts toward the in-flight capacity."""
        with self._s.cond:
            self.held -= 1
            self._s.cond.notify_all()

    # -- handler calls and their timeout -----------------------------------------------------

    def begin_run(self, msg: Any) -> None:
        """Note the handler call starting (its timeout counts from now)."""
        s = self._s
        now = s.clock.monotonic()
        timeout = self.handler_timeout
        with s.cond:
            self.running[msg] = Run(started=now, check_at=now + (timeout or 0.0))
            if timeout is not None:
                s.cond.notify_all()  # the settler watches the deadline

    def end_run(self, msg: Any) -> bool:
        """Note the handler call over; True if it had run past its timeout."""
        s = self._s
        with s.cond:
            run = self.running.pop(msg, None)
            if run is None or not run.timed_out:
                return False
            s.stats.stuck -= 1
            s.cond.notify_all()  # in hand again until settled: not idle
        log.warning("listener %s: handler on %s/%s returned after %.1f s, past "
                    "handler_timeout_seconds=%g; settling it now (state %s)", s.name,
                    msg.topic, msg.id, s.clock.monotonic() - run.started,
                    self.handler_timeout, msg.state)
        return True

    def overdue(self, now: float) -> tuple[list[tuple[Any, float, bool]], float | None]:
        """(Under the lock.) Handler calls due for a look: newly past their timeout
        (True: counted now) or still running on (False: a reminder, at 2x, 4x, ... the
        timeout); and when the next one falls due."""
        found: list[tuple[Any, float, bool]] = []
        next_at: float | None = None
        timeout = self.handler_timeout
        if timeout is None:
            return found, None
        stats = self._s.stats
        for msg, run in self.running.items():
            if run.check_at <= now:
                ran = now - run.started
                found.append((msg, ran, not run.timed_out))
                if not run.timed_out:
                    run.timed_out = True
                    stats.timed_out += 1
                    stats.stuck += 1
                run.check_at = run.started + 2 * max(ran, timeout)
            if next_at is None or run.check_at < next_at:
                next_at = run.check_at
        return found, next_at

    def stuck_handlers(self) -> dict[str, float]:
        """Handlers running past their timeout now: message id -> seconds running."""
        now = self._s.clock.monotonic()
        with self._s.cond:
            return {m.id: now - r.started for m, r in self.running.items() if r.timed_out}
