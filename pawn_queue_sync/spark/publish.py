"""DataFrame -> topic: :func:`publish_dataframe`, where every partition publishes its rows
through its process's queue, and the :class:`Publisher` that turns rows into messages
(shared with the data source's writer).

Delivery is at-least-once; see ``docs/spark.md`` for what a retried task does.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import PayloadError, PublishError
from .queues import is_packed, queue_for, queue_for_driver
from .rows import as_utc, message_id_for, to_jsonable
from .segments import write_segments
from .settings import ConfigSource, Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

log = logging.getLogger(__name__)

__all__ = ["Publisher", "publish_dataframe"]


class Publisher:
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
        packed: bool = False,
    ) -> None:
        self.settings = settings
        self.packed = packed
        self.topic = topic
        self.payload_col = payload_col
        self.id_col = id_col
        self.created_at_col = created_at_col
        self.default_created_at = default_created_at
        self.batch_size = batch_size
        self.threads = threads
        self.producer_name = producer_name

    def __repr__(self) -> str:
        return f"Publisher(topic={self.topic!r}, {self.settings.describe()})"

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
        pq = queue_for(self.settings)
        producer = pq.register_producer(self.producer_name)
        flush, size = self._flush, self.batch_size
        if self.packed:  # segments: as many full ones at a time as there are threads
            flush, size = self._flush_packed, self.threads * max(
                self.batch_size, pq.config.publishing.max_segment_messages)
        count = 0
        with ThreadPoolExecutor(self.threads, thread_name_prefix="pawnq-spark-pub") as pool:
            batch: list[tuple[Any, str | None, datetime | None]] = []
            for row in rows:
                batch.append(self.message(row))
                if len(batch) >= size:
                    count += flush(pool, producer, batch)
                    batch = []
            if batch:
                count += flush(pool, producer, batch)
        return count

    def _flush_packed(self, pool: ThreadPoolExecutor, producer: Any, batch: list[Any]) -> int:
        """Write ``batch`` as segments: through ``publish_batch``, or, when rows carry
        an id or a time, as segments with deterministic ids (a retried task rewrites
        the same segments; see :mod:`.segments`)."""
        if self.id_col is None and self.created_at_col is None:
            return len(producer.publish_batch(self.topic, [p for p, _, _ in batch],
                                              threads=self.threads))
        ctx = queue_for(self.settings).context
        limits = ctx.config.publishing
        items = [(payload, mid or str(uuid.uuid4()), when or ctx.next_timestamp())
                 for payload, mid, when in batch]
        return write_segments(
            ctx.store, pool.submit, self.topic, producer.id, items,
            max_line_bytes=limits.max_payload_bytes,
            max_messages=limits.max_segment_messages, max_bytes=limits.max_segment_bytes,
        )

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
        packed = is_packed(pq.store, topic)
    for col in (payload_col, id_col, created_at_col):
        if col is not None and col not in df.columns:
            raise ValueError(f"no column {col!r} in the DataFrame (columns: {df.columns})")
    if packed and id_col is not None:  # the same segments from a retried task's rows
        df = df.sortWithinPartitions(*[c for c in (created_at_col, id_col) if c])
    publisher = Publisher(
        settings,
        topic,
        payload_col=payload_col,
        id_col=id_col,
        created_at_col=created_at_col,
        default_created_at=datetime.now(timezone.utc),
        batch_size=batch_size,
        threads=threads,
        producer_name=producer_name,
        packed=packed,
    )

    def run(rows: Iterator[Row]) -> Iterator[int]:
        yield publisher.publish(rows)

    total = sum(df.rdd.mapPartitions(run).collect())
    log.info("published %d messages to %r from Spark", total, topic)
    return total
