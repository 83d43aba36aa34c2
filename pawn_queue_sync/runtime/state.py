"""What the loops of one :class:`~pawn_queue_sync.runtime.Listener` share: its counters
(:class:`ListenerStats`), one Condition, the clock, and the stop flags.

Each loop is a class of its own (poll loop, handler pool, settler, in-flight counter);
they share one :class:`threading.Condition` because their accounting moves together
(a slot freed by a handler is what the poll loop waits for; a settled message is what
the shutdown waits for), and one lock makes those moves atomic.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

import attrs

from ..clock import Clock
from .ports import ConsumerPort, PollingPort
from .refresher import LeaseRefresher

__all__ = ["ListenerStats", "Shared", "describe_error", "ERROR_TEXT_LIMIT"]

#: Characters of error text recorded in a message (``last_error``, dead-letter reason).
ERROR_TEXT_LIMIT = 2000


@attrs.define
class ListenerStats:
    """What a listener did, per message settled. ``processed``: the handler returned
    and the message was acked (by us, or by the handler itself); ``failed``: the
    handler raised and the message went back for a retry; ``dead_lettered``: the
    handler raised on the last allowed delivery (or nacked the message itself);
    ``lost``: not settled by us, so it will be redelivered: the lease was taken over,
    or the ack was refused (LeaseLostError), given up after store errors, or failed
    with an unexpected (non-store) error; ``released``: given back unhandled (at stop),
    or released by the handler.

    ``timed_out``: handler calls that ran past ``handler_timeout_seconds`` (their
    leases were abandoned, see :class:`Listener`); such a message is also counted as
    whatever it ends as once its handler returns. ``stuck``: handlers running past
    their timeout right now (a gauge, not a total). ``ack_errors``: failed ack
    batches (each is retried after a store error, given up after any other)."""

    processed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    lost: int = 0
    released: int = 0
    polls: int = 0
    empty_polls: int = 0
    poll_errors: int = 0
    claimed: int = 0
    ack_batches: int = 0
    ack_errors: int = 0
    timed_out: int = 0
    stuck: int = 0


@attrs.define(eq=False)
class Shared:
    """The state every loop of one listener reads. ``cond`` guards ``stats``,
    ``stopping`` and the loops' own accounting; ``stop_requested`` is a plain flag
    (set by :meth:`request_stop`, maybe in a signal handler, so without the lock)."""

    consumer: ConsumerPort
    refresher: LeaseRefresher
    clock: Clock
    polling: PollingPort
    name: str
    max_workers: int
    request_stop: Callable[[], None]
    cond: threading.Condition = attrs.field(factory=threading.Condition)
    stats: ListenerStats = attrs.field(factory=ListenerStats)
    #: under ``cond``: the shutdown sequence has begun (no new claims, no new handlers)
    stopping: bool = False
    #: set by a stop request from anywhere; read without the lock
    stop_requested: bool = False

    def wait(self, timeout: float | None) -> bool:
        """(Under ``cond``.) Wait for a notify or ``timeout`` seconds on the clock."""
        return self.clock.wait(self.cond, timeout)

    def count(self, **deltas: int) -> None:
        """Add to counters of :attr:`stats`, under the lock."""
        with self.cond:
            for field, delta in deltas.items():
                setattr(self.stats, field, getattr(self.stats, field) + delta)


def describe_error(exc: BaseException, limit: int = ERROR_TEXT_LIMIT) -> str:
    """``Type: message`` and the last frames of the traceback, at most ``limit`` chars."""
    head = f"{type(exc).__name__}: {exc}"
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)
    text = head + "\n" + "".join(frames[1:-1]).rstrip()
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
