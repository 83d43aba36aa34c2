"""Batch writes of the ``pawnqueue`` data source: each task publishes its partition's rows
(as :func:`~pawn_queue_sync.spark.publish_dataframe` does) and returns its count; the
driver adds the counts up."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage

from ..errors import ConfigError
from .options import int_option
from .publish import Publisher
from .queues import is_packed, require_topic, store_for
from .settings import Settings

#: The data source's logger, as docs/spark.md names it for the commit's log line.
log = logging.getLogger("pawn_queue_sync.spark.datasource")

__all__ = ["QueueWriter"]


class _Published(WriterCommitMessage):
    """A write task's commit message: how many messages it published."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __repr__(self) -> str:
        return f"_Published({self.count})"


class QueueWriter(DataSourceWriter):
    """Publishes each partition's rows (see :func:`~pawn_queue_sync.spark.publish_dataframe`
    for the row -> message rules); the driver sums the tasks' commit messages.

    Options: ``payloadColumn``, ``idColumn`` (deterministic ids: a retried task
    overwrites), ``createdAtColumn``, ``batchSize``, ``publishThreads``,
    ``producerName``. On a packed topic each task writes its rows as segments; with
    ``idColumn`` their ids are deterministic given the task's rows in their order (see
    ``docs/spark.md``).
    """

    def __init__(
        self, settings: Settings, topic: str, options: dict[str, str], columns: list[str]
    ) -> None:
        cols = {}
        for opt in ("payloadColumn", "idColumn", "createdAtColumn"):
            col = options.get(opt.lower())
            if col is not None and col not in columns:
                raise ConfigError(opt, f"no column {col!r} (columns: {columns})")
            cols[opt] = col
        self.settings = settings
        self.topic = topic
        self.published: int | None = None
        store = store_for(settings)
        require_topic(store, topic)
        self.publisher = Publisher(
            settings,
            topic,
            payload_col=cols["payloadColumn"],
            id_col=cols["idColumn"],
            created_at_col=cols["createdAtColumn"],
            default_created_at=datetime.now(timezone.utc),
            batch_size=int_option(options, "batchSize", 500),
            threads=int_option(options, "publishThreads", 8),
            producer_name=options.get("producername", "spark-writer"),
            packed=is_packed(store, topic),
        )

    def __repr__(self) -> str:
        return f"QueueWriter(topic={self.topic!r}, {self.settings.describe()})"

    def write(self, iterator: Iterator[Any]) -> _Published:
        return _Published(self.publisher.publish(iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.published = sum(m.count for m in messages if isinstance(m, _Published))
        log.info("pawnqueue: published %d messages to %r in %d tasks",
                 self.published, self.topic, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(m.count for m in messages if isinstance(m, _Published))
        failed = sum(1 for m in messages if m is None)
        log.warning(
            "pawnqueue: write to %r aborted: %d task(s) failed; %d messages were already "
            "published by the tasks that succeeded and stay published", self.topic, failed,
            done,
        )
