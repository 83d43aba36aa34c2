"""Consume until a topic is idle, then return: the building block for embedders.

A Spark ``mapPartitions``/``foreachPartition`` task (or any code that must not leave
threads behind) calls :func:`drain`; when it returns, every thread it started has been
joined, every handled message is acked, dead-lettered or released, and nothing touched
signals. It never starts an event loop.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

from .listen import Handler, Listener

if TYPE_CHECKING:
    from ..queue.consumer import Consumer

log = logging.getLogger(__name__)

__all__ = ["DrainResult", "drain"]


class DrainResult(NamedTuple):
    """What :func:`drain` did, counted in handler calls.

    ``processed``: the handler returned (the message was acked, or settled by the
    handler itself); ``failed``: the handler raised and the message was released for a
    retry (recorded in the message; it may be handled again, here or elsewhere);
    ``dead_lettered``: the handler raised on the last allowed delivery
    (``polling.max_delivery_count``) and the message was moved to dead-letter with the
    error.
    """

    processed: int
    failed: int
    dead_lettered: int


def drain(
    consumer: Consumer,
    handler: Handler,
    *,
    max_messages: int | None = None,
    idle_timeout_s: float = 5.0,
    threads: int = 4,
) -> DrainResult:
    """Run ``handler`` on ``threads`` threads over ``consumer``'s topics until they are
    idle, then stop, join every thread, and return the counts.

    - ``idle_timeout_s``: stop once polls have found nothing and no message was in hand
      for this many seconds (``0``: stop at the first empty poll with nothing in hand).
    - ``max_messages``: stop after this many handler calls (retries count again); no
      more than that are ever claimed. ``None``: no limit.
    - ``threads``: handler threads; at most that many messages are claimed at a time.

    Failures are handled as by :meth:`Consumer.listen`: retried with backoff until
    ``polling.max_delivery_count``, then dead-lettered; a pending retry is recorded at
    once when the drain ends. Before returning, pending acks are flushed and the lease
    refresher is stopped and joined. A handler still running after the listener's
    shutdown timeout (30 s) is left running (its lease will expire, so the message is
    redelivered): handlers must finish.

    Threads of the :class:`~pawn_queue_sync.PawnQueue` itself (its claim and publish
    pools) live until ``PawnQueue.close()``; inside a Spark task close the queue before
    the partition function returns.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads!r}")
    if idle_timeout_s < 0:
        raise ValueError(f"idle_timeout_s must be >= 0, got {idle_timeout_s!r}")
    listener = Listener(
        consumer,
        handler,
        max_workers=threads,
        max_messages=max_messages,
        idle_timeout=idle_timeout_s,
    )
    listener.run()
    s = listener.stats
    log.debug("drain of %s: %s", consumer.topics, s)
    return DrainResult(processed=s.processed, failed=s.failed, dead_lettered=s.dead_lettered)
