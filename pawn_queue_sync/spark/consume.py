"""Topic -> DataFrame: :func:`consume_to_dataframe` claims messages in the executors,
hands them to the driver as a DataFrame, renews their leases on the driver, and acks
them only once the DataFrame is built (and ``before_ack`` returned). Delivery is
at-least-once; see ``docs/spark.md`` for exactly when acks happen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import LeaseLostError
from ..queue.consumer import Consumer
from ..queue.message import Message
from ..runtime.options import Default, renamed_value
from ..runtime.refresher import LeaseRefresher
from .queues import is_packed, queue_for, queue_for_driver
from .rows import MESSAGE_COLUMNS, parse_time, payload_text
from .settings import ConfigSource, Settings
from .tasks import check_tasks, share, task_consumer_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

__all__ = ["consume_to_dataframe"]


def consume_to_dataframe(
    spark: SparkSession,
    topic: str,
    config: ConfigSource,
    *,
    max_messages: int | None = 10_000,
    partitions: int = 2,
    idle_timeout_seconds: float = Default(1.0),
    before_ack: Callable[[DataFrame], Any] | None = None,
    consumer_name: str = "spark-consume-to-dataframe",
    max_claim_seconds: float | None = None,
    idle_timeout_s: float | None = None,
) -> DataFrame:
    """Take up to ``max_messages`` messages off ``topic`` into a DataFrame of
    ``(id, topic, producer_id, created_at, payload)`` (payload as JSON text).

    ``partitions`` tasks claim messages under leases (no ack) until the topic is idle
    for ``idle_timeout_seconds``, their share of ``max_messages`` is claimed or
    ``max_claim_seconds`` (default: half the visibility timeout) have passed, and
    return them to the driver. The driver builds the DataFrame from those rows (it is never
    recomputed from the queue), calls ``before_ack(df)`` if given (e.g. write it
    somewhere durable), and only then acks the messages. From the moment the rows are
    back until the ack, the driver renews their leases, so a long ``before_ack`` does
    not let other consumers take them. If a task fails, or
    ``before_ack`` raises, the messages are not acked: they reappear once their lease
    expires or is released (at-least-once). Without ``before_ack`` the messages leave
    the queue when this function returns, so persist the DataFrame.

    On a packed topic the driver claims instead of ``partitions`` tasks: a message's
    ack is recorded in its segment's lease, which only the consumer that claimed the
    segment holds, and one GET reads a whole segment.

    ``idle_timeout_s`` is the deprecated name of ``idle_timeout_seconds`` (a
    DeprecationWarning).
    """
    idle_timeout_seconds = float(renamed_value("idle_timeout_s", idle_timeout_s,
                                               "idle_timeout_seconds", idle_timeout_seconds))
    check_tasks(consumer_name, partitions)
    settings = Settings(config)
    with queue_for_driver(settings) as pq:
        consumer = pq.register_consumer(consumer_name, [topic])  # acks on the driver
        visibility = pq.config.polling.visibility_timeout_seconds
        budget = visibility / 2 if max_claim_seconds is None else max_claim_seconds
        job_started = pq.context.clock.monotonic()  # every lease below is younger

        def claim(index: int, _: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
            task = queue_for(settings).register_consumer(
                task_consumer_name(consumer_name, index), [topic])
            for m in _claim(task, share(max_messages, partitions, index),
                            idle_timeout_seconds, budget):
                yield (m.id, m.topic, m.producer_id, m.created_at, payload_text(m.payload),
                       m.key, m.lease_key, m.lease_token)

        if is_packed(pq.store, topic):
            # A segment's acks are recorded in its lease, which only the consumer that
            # claimed it holds: the driver claims (a segment is one GET for many
            # messages) and acks itself.
            msgs = list(_claim(consumer, max_messages, idle_timeout_seconds, budget))
            claimed = [(m.id, m.topic, m.producer_id, m.created_at, payload_text(m.payload))
                       for m in msgs]
        else:
            rdd = spark.sparkContext.parallelize(range(partitions), partitions)
            claimed = rdd.mapPartitionsWithIndex(claim).collect()
            msgs = [
                Message(
                    id=c[0], topic=topic, producer_id=c[2], created_at=c[3] or "",
                    payload=None, key=c[5], lease_key=c[6], lease_token=c[7],
                    lease_written_at=job_started, consumer=consumer,
                )
                for c in claimed
            ]
        # The leases are as old as the claims (up to the claim budget) and nothing in
        # the executors renews them any more: the driver holds the tokens now, so it
        # renews them until they are acked or released, however long before_ack runs.
        refresher = LeaseRefresher(
            consumer, pq.config.polling.lease_refresh_interval_seconds,
            name=f"pawnq-spark-refresher-{topic}",
        )
        for msg in msgs:
            refresher.track(msg)
        refresher.start()
        try:
            rows = [(c[0], c[1], c[2], parse_time(c[3]), c[4]) for c in claimed]
            df = spark.createDataFrame(rows, MESSAGE_COLUMNS)
            if before_ack is not None:
                try:
                    before_ack(df)
                except BaseException:
                    refresher.stop()  # no renewal may land after a release
                    for msg in msgs:
                        consumer.release(msg)
                    raise
            try:
                consumer.ack_many(msgs)  # an ack waits for a renewal of its message
            except LeaseLostError as exc:
                log.warning("consume_to_dataframe(%r): %s; those may be delivered again",
                            topic, exc)
        finally:
            refresher.stop()
    log.info("consume_to_dataframe(%r): %d messages", topic, len(rows))
    return df


def _claim(
    consumer: Consumer,
    limit: int | None,
    idle_timeout_seconds: float,
    claim_budget_seconds: float,
) -> Iterator[Message]:
    """Claim messages (leases only) until idle, ``limit`` or ``claim_budget_seconds``."""
    polling = consumer.context.config.polling
    got = 0
    started = time.monotonic()
    idle_since: float | None = None
    while limit is None or got < limit:
        if time.monotonic() - started > claim_budget_seconds:
            break  # keep every lease well inside its visibility timeout
        want = polling.max_messages_per_poll
        msgs = consumer.poll(want if limit is None else min(want, limit - got))
        if not msgs:
            now = time.monotonic()
            idle_since = idle_since or now
            if now - idle_since >= idle_timeout_seconds:
                break
            time.sleep(min(polling.interval_seconds,
                           max(idle_timeout_seconds - (now - idle_since), 0.0)))
            continue
        idle_since = None
        got += len(msgs)
        yield from msgs
