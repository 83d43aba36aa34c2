"""DataFrames to topics and back, with the work done in Spark executors.

- :func:`publish_dataframe`: every partition publishes its rows;
- :func:`process_topic`: N tasks each drain a topic through a handler;
- :func:`consume_to_dataframe`: claim messages in executors, hand them to the driver as
  a DataFrame, and ack them only then.

Delivery is at-least-once throughout; see ``docs/spark.md`` for exactly when acks happen.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import LeaseLostError, PayloadError, PublishError
from ..queue.core import PawnQueue
from ..queue.message import Message
from ..runtime.drain import drain
from ..runtime.refresher import LeaseRefresher
from ._common import (
    MESSAGE_COLUMNS,
    ConfigSource,
    Settings,
    as_utc,
    message_id_for,
    parse_time,
    payload_text,
    queue_for,
    share,
    to_jsonable,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

log = logging.getLogger(__name__)

__all__ = [
    "ProcessResult",
    "consume_to_dataframe",
    "process_topic",
    "publish_dataframe",
]

Handler = Callable[[Message], Any]


# -- DataFrame -> topic ----------------------------------------------------------------------


class _Publisher:
    """Turns rows into messages and publishes them in batches on a thread pool that
    is joined before :meth:`publish` returns (nothing runs after a task ends)."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        *,
        payload_col: str | None,
        id_col: str | None,
        created_at_col: str | None,
        default_created_at: datetime | None,
        batch_size: int,
        threads: int,
        producer_name: str,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.payload_col = payload_col
        self.id_col = id_col
        self.created_at_col = created_at_col
        self.default_created_at = default_created_at
        self.batch_size = batch_size
        self.threads = threads
        self.producer_name = producer_name

    def __repr__(self) -> str:
        return f"_Publisher(topic={self.topic!r}, {self.settings.describe()})"

    def message(self, row: Row) -> tuple[Any, str | None, datetime | None]:
        """(payload, message id, created_at) of one row."""
        if self.payload_col is not None:
            value = row[self.payload_col]
            if isinstance(value, str):  # JSON text, as the read side produces it
                try:
                    payload = json.loads(value)
                except ValueError:
                    raise PayloadError(
                        f"column {self.payload_col!r} holds a string that is not JSON"
                    ) from None
            else:
                payload = to_jsonable(value)
        else:
            payload = to_jsonable(row.asDict(recursive=False))
        mid = message_id_for(self.topic, row[self.id_col]) if self.id_col else None
        when = as_utc(row[self.created_at_col]) if self.created_at_col else None
        if mid is not None and when is None:
            when = self.default_created_at  # same key when a retried task republishes
        return payload, mid, when

    def publish(self, rows: Iterable[Row]) -> int:
        """Publish every row; returns how many. Raises PublishError if any write
        failed (after every started write finished)."""
        producer = queue_for(self.settings).register_producer(self.producer_name)
        count = 0
        with ThreadPoolExecutor(self.threads, thread_name_prefix="pawnq-spark-pub") as pool:
            batch: list[tuple[Any, str | None, datetime | None]] = []
            for row in rows:
                batch.append(self.message(row))
                if len(batch) >= self.batch_size:
                    count += self._flush(pool, producer, batch)
                    batch = []
            if batch:
                count += self._flush(pool, producer, batch)
        return count

    def _flush(self, pool: ThreadPoolExecutor, producer: Any, batch: list[Any]) -> int:
        futures = [
            pool.submit(producer.publish, self.topic, payload, message_id=mid, created_at=when)
            for payload, mid, when in batch
        ]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise PublishError(
                f"{len(errors)} of {len(batch)} messages to {self.topic!r} were not "
                f"published (first error: {errors[0]})"
            ) from errors[0]
        return len(batch)


def publish_dataframe(
    df: DataFrame,
    topic: str,
    config: ConfigSource,
    payload_col: str | None = None,
    *,
    id_col: str | None = None,
    created_at_col: str | None = None,
    batch_size: int = 500,
    threads: int = 8,
    producer_name: str = "spark-publisher",
) -> int:
    """Publish every row of ``df`` to ``topic``; returns how many were published.

    A row becomes a JSON object of its columns, or ``payload_col`` holds the payload
    (a string column is JSON text; structs, maps and arrays are converted). Each
    partition publishes through its process's client, ``batch_size`` rows at a time on
    ``threads`` threads, all joined before the task ends. The count is the sum of the
    successful tasks' counts, not a re-read.

    A failed task that Spark retries publishes its rows again: duplicates, unless
    ``id_col`` names a column that identifies each row. Then the message id is derived
    from it (the value itself if it is a UUID, else ``uuid5``) and the key's timestamp
    comes from ``created_at_col`` or, without it, from the time of this call, so a
    retried task overwrites the messages it wrote before instead of adding new ones.
    """
    if batch_size < 1 or threads < 1:
        raise ValueError("batch_size and threads must be >= 1")
    settings = Settings(config)
    with queue_for_driver(settings) as pq:
        pq.context.require_topic(topic)  # fail here, not in every task
    for col in (payload_col, id_col, created_at_col):
        if col is not None and col not in df.columns:
            raise ValueError(f"no column {col!r} in the DataFrame (columns: {df.columns})")
    publisher = _Publisher(
        settings,
        topic,
        payload_col=payload_col,
        id_col=id_col,
        created_at_col=created_at_col,
        default_created_at=datetime.now(timezone.utc),
        batch_size=batch_size,
        threads=threads,
        producer_name=producer_name,
    )

    def run(rows: Iterator[Row]) -> Iterator[int]:
        yield publisher.publish(rows)

    total = sum(df.rdd.mapPartitions(run).collect())
    log.info("published %d messages to %r from Spark", total, topic)
    return total


@contextmanager
def queue_for_driver(settings: Settings) -> Iterator[PawnQueue]:
    """A queue started for one call on the driver, closed after it."""
    with PawnQueue(settings.config()) as pq:
        yield pq


# -- topic -> processing ------------------------------------------------------------------------


class ProcessResult(NamedTuple):
    """What :func:`process_topic` did, summed over its tasks (successful attempts).

    ``processed``: handler calls that returned (message acked); ``failed``: handler
    calls that raised and sent the message back for a retry; ``dead_lettered``:
    messages moved to dead-letter after their last allowed delivery failed.
    """

    processed: int
    failed: int
    dead_lettered: int


#: The registry's limit on a consumer name (see queue.registry.register).
_MAX_NAME = 256


def task_consumer_name(consumer_name: str, index: int) -> str:
    """The consumer that task (partition) ``index`` registers: ``"<consumer_name>/<index>"``,
    so tasks running together have ids of their own (the registry rank that spreads
    csprng_verify claims counts each), and a retried task reuses its partition's id.
    The same rule as a WorkerPool's children."""
    return f"{consumer_name}/{index}"


def _check_task_names(consumer_name: str, partitions: int) -> None:
    """Refuse, on the driver, a base name whose task names the registry would refuse."""
    if (not isinstance(consumer_name, str) or not consumer_name
            or len(task_consumer_name(consumer_name, partitions - 1)) > _MAX_NAME):
        raise ValueError(f"consumer_name must be a non-empty string; task i registers as "
                         f"'<consumer_name>/i', at most {_MAX_NAME} characters")


def process_topic(
    spark: SparkSession,
    topic: str,
    handler: Handler,
    config: ConfigSource,
    partitions: int = 2,
    max_messages: int | None = None,
    idle_timeout_s: float = 5.0,
    *,
    threads: int = 8,
    consumer_name: str = "spark-process-topic",
) -> ProcessResult:
    """Run ``partitions`` Spark tasks that each consume ``topic`` and call
    ``handler(message)`` on ``threads`` threads until the topic has been idle for
    ``idle_timeout_s`` (or the task's share of ``max_messages`` was handled).

    A message is acked only after ``handler`` returned; a handler that raises sends it
    back for a retry, and after ``polling.max_delivery_count`` deliveries it is
    dead-lettered with the error. Each task runs :func:`pawn_queue_sync.runtime.drain`,
    which joins all its threads before the task ends. If a task dies, the messages it
    held reappear after their lease (``polling.visibility_timeout_seconds``) and are
    delivered again (at-least-once). Counts come from successful task attempts.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions!r}")
    _check_task_names(consumer_name, partitions)
    settings = Settings(config)
    with queue_for_driver(settings) as pq:
        pq.context.require_topic(topic)

    def run(index: int, _: Iterator[Any]) -> Iterator[tuple[int, int, int]]:
        pq = queue_for(settings)
        consumer = pq.register_consumer(task_consumer_name(consumer_name, index), [topic])
        result = drain(
            consumer,
            handler,
            max_messages=share(max_messages, partitions, index),
            idle_timeout_s=idle_timeout_s,
            threads=threads,
        )
        yield (result.processed, result.failed, result.dead_lettered)

    rdd = spark.sparkContext.parallelize(range(partitions), partitions)
    counts = rdd.mapPartitionsWithIndex(run).collect()
    result = ProcessResult(*(sum(c[i] for c in counts) for i in range(3)))
    log.info("process_topic(%r): %s", topic, result)
    return result


# -- topic -> DataFrame -------------------------------------------------------------------------


def consume_to_dataframe(
    spark: SparkSession,
    topic: str,
    config: ConfigSource,
    *,
    max_messages: int | None = 10_000,
    partitions: int = 2,
    idle_timeout_s: float = 1.0,
    before_ack: Callable[[DataFrame], Any] | None = None,
    consumer_name: str = "spark-consume-to-dataframe",
    max_claim_seconds: float | None = None,
) -> DataFrame:
    """Take up to ``max_messages`` messages off ``topic`` into a DataFrame of
    ``(id, topic, producer_id, created_at, payload)`` (payload as JSON text).

    ``partitions`` tasks claim messages under leases (no ack) until the topic is idle
    for ``idle_timeout_s``, their share of ``max_messages`` is claimed or
    ``max_claim_seconds`` (default: half the visibility timeout) have passed, and
    return them to the driver. The driver builds the DataFrame from those rows (it is never
    recomputed from the queue), calls ``before_ack(df)`` if given (e.g. write it
    somewhere durable), and only then acks the messages. From the moment the rows are
    back until the ack, the driver renews their leases, so a long ``before_ack`` does
    not let other consumers take them. If a task fails, or
    ``before_ack`` raises, the messages are not acked: they reappear once their lease
    expires or is released (at-least-once). Without ``before_ack`` the messages leave
    the queue when this function returns, so persist the DataFrame.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions!r}")
    _check_task_names(consumer_name, partitions)
    settings = Settings(config)
    with queue_for_driver(settings) as pq:
        consumer = pq.register_consumer(consumer_name, [topic])  # acks on the driver
        visibility = pq.config.polling.visibility_timeout_seconds
        budget = visibility / 2 if max_claim_seconds is None else max_claim_seconds
        job_started = pq.context.clock.monotonic()  # every lease below is younger

        def claim(index: int, _: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
            yield from _claim_rows(settings, topic, task_consumer_name(consumer_name, index),
                                   share(max_messages, partitions, index),
                                   idle_timeout_s, budget)

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


def _claim_rows(
    settings: Settings,
    topic: str,
    consumer_name: str,
    limit: int | None,
    idle_timeout_s: float,
    claim_budget_s: float,
) -> Iterator[tuple[Any, ...]]:
    """Claim messages (leases only) until idle, ``limit`` or ``claim_budget_s``; yield
    each as (id, topic, producer_id, created_at, payload, key, lease_key, token)."""
    pq = queue_for(settings)
    consumer = pq.register_consumer(consumer_name, [topic])
    per_poll = pq.config.polling.max_messages_per_poll
    interval = pq.config.polling.interval_seconds
    got = 0
    started = time.monotonic()
    idle_since: float | None = None
    while limit is None or got < limit:
        if time.monotonic() - started > claim_budget_s:
            break  # keep every lease well inside its visibility timeout
        want = per_poll if limit is None else min(per_poll, limit - got)
        msgs = consumer.poll(want)
        if not msgs:
            now = time.monotonic()
            idle_since = idle_since or now
            if now - idle_since >= idle_timeout_s:
                break
            time.sleep(min(interval, max(idle_timeout_s - (now - idle_since), 0.0)))
            continue
        idle_since = None
        for m in msgs:
            got += 1
            yield (m.id, m.topic, m.producer_id, m.created_at, payload_text(m.payload),
                   m.key, m.lease_key, m.lease_token)
