"""Consume until a topic is idle, then return: the building block for embedders.

A Spark ``mapPartitions``/``foreachPartition`` task (or any code that must not leave
threads behind) calls :func:`drain`; when it returns, every thread it started has been
joined, every handled message is acked, dead-lettered or released, and nothing touched
signals. It never starts an event loop.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from .listen import Listener
from .options import Default, check_duration, renamed_value
from .ports import ConsumerPort, Handler

log = logging.getLogger(__name__)

__all__ = ["DrainResult", "drain"]


class DrainResult(NamedTuple):
    """What :func:`drain` did, counted per handler call (a message handled again after a
    retry counts again); the listener's :class:`ListenerStats` fields of those names.

    ``processed``: the message was acked: by the drain after the handler returned, and
    only once that ack succeeded, or by the handler itself (``msg.ack()``). A message
    the handler released, or whose ack failed or found its lease taken over, is not
    processed: it will be delivered again (the listener counts it ``released`` or
    ``lost``). ``failed``: the handler raised and the message went back for a retry
    (the attempt recorded in the message; it may be handled again, here or elsewhere).
    ``dead_lettered``: moved to dead-letter with the error, the handler having raised
    on the last allowed delivery (``polling.max_delivery_count``), or nacked by the
    handler itself. ``timed_out``: handler calls that ran past
    ``handler_timeout_seconds`` (also counted as whatever they ended as, if they
    returned before the drain did).
    """

    processed: int
    failed: int
    dead_lettered: int
    timed_out: int = 0
    #: polls that failed (store errors, logged): non-zero with nothing processed means
    #: the store was unreachable, not that the topics were empty
    poll_errors: int = 0


def drain(
    consumer: ConsumerPort,
    handler: Handler,
    *,
    max_messages: int | None = None,
    idle_timeout_seconds: float = Default(5.0),
    threads: int = 4,
    handler_timeout_seconds: float | None = None,
    idle_timeout_s: float | None = None,
) -> DrainResult:
    """Run ``handler`` on ``threads`` threads over ``consumer``'s topics until they are
    idle, then stop, join every thread, and return the counts.

    - ``idle_timeout_seconds``: stop once polls have found nothing and no message was in
      hand
      for this many seconds (``0``: stop at the first empty poll with nothing in hand).
    - ``max_messages``: stop after this many handler calls (retries count again); no
      more than that are ever claimed. ``None``: no limit.
    - ``threads``: handler threads; at most that many messages are claimed at a time.
    - ``handler_timeout_seconds``: give up on a handler call running longer (``None``:
      no limit). Its lease is no longer renewed and expires, so the message is
      delivered again; the thread keeps its slot until it returns (Python cannot stop
      it), but no longer keeps the drain busy: the drain can go idle and return while
      it still runs (see :class:`~pawn_queue_sync.runtime.Listener`).

    Failures are handled as by :meth:`Consumer.listen`: retried with backoff until
    ``polling.max_delivery_count``, then dead-lettered; a pending retry is recorded at
    once when the drain ends. Before returning, pending acks are flushed, the lease
    refresher is stopped and joined, and the segments of packed topics held with no
    message out are given back (their reserved deliveries not counted). A handler
    still running after the listener's shutdown timeout (30 s), or already past
    ``handler_timeout_seconds``, is left
    running (its lease will expire, so the message is redelivered): handlers must
    finish.

    ``idle_timeout_s`` is the deprecated name of ``idle_timeout_seconds`` (a
    DeprecationWarning; both given is a TypeError).

    Threads of the :class:`~pawn_queue_sync.PawnQueue` itself (its claim and publish
    pools) live until ``PawnQueue.close()``; inside a Spark task close the queue before
    the partition function returns.
    """
    idle_timeout_seconds = renamed_value("idle_timeout_s", idle_timeout_s,
                                         "idle_timeout_seconds", idle_timeout_seconds)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads!r}")
    check_duration("idle_timeout_seconds", idle_timeout_seconds)
    if idle_timeout_seconds < 0:
        raise ValueError(f"idle_timeout_seconds must be >= 0, got {idle_timeout_seconds!r}")
    listener = Listener(
        consumer,
        handler,
        max_workers=threads,
        max_messages=max_messages,
        idle_timeout_seconds=float(idle_timeout_seconds),
        handler_timeout_seconds=handler_timeout_seconds,
    )
    listener.run()
    s = listener.stats
    log.debug("drain of %s: %s", consumer.topics, s)
    return DrainResult(processed=s.processed, failed=s.failed, dead_lettered=s.dead_lettered,
                       timed_out=s.timed_out, poll_errors=s.poll_errors)
