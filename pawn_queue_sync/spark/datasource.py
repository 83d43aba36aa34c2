"""The ``pawnqueue`` Spark Python Data Source: batch snapshot reads, batch writes and a
streaming source whose offsets are message keys.

Register it with :func:`pawn_queue_sync.spark.register`, then::

    spark.read.format("pawnqueue").option("topic", "orders").options(**conn).load()
    df.write.format("pawnqueue").option("topic", "orders").options(**conn).mode("append").save()
    spark.readStream.format("pawnqueue").option("topic", "orders").options(**conn).load()

Connection options (``conn`` above; :func:`~pawn_queue_sync.spark.spark_options` makes
them from a configuration): ``configPath`` (a YAML configuration file, read on the
driver), and/or ``endpointUrl``, ``bucketName``, ``regionName``, ``accessKey``,
``secretKey``, ``useSsl``, ``addressingStyle`` (``localPath`` for the local store); the
``PAWNQUEUE_*`` environment fills the rest. The credential options are named so that
Spark's default redaction hides them wherever it shows options (streaming plans do);
``aws_access_key_id`` would not be, and is refused. Unknown options are refused (a
misspelt credential option would not be redacted either). No ``repr`` here shows an
option value other than the topic, bucket and endpoint.

The streaming semantics (offsets, when messages are deleted, stragglers) are described
on :class:`QueueStreamReader` and in ``docs/spark.md``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from .. import layout
from ..errors import ConfigError, ObjectNotFound, StorageError, TopicNotFoundError
from ..storage.base import Store
from ..storage.factory import build_store
from ._common import (
    CONFIG_PATH_OPTION,
    CONNECTION_OPTIONS,
    DEAD_LETTER_SCHEMA,
    SNAPSHOT_SCHEMA,
    UNREDACTED_OPTIONS,
    Settings,
    dead_letter_row,
    decode_doc,
    snapshot_row,
    split_evenly,
)

try:  # the admission-control streaming API (pyspark >= 4.2)
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    _HAS_READ_LIMITS = True
except ImportError:  # pragma: no cover - older pyspark: no streaming source
    _HAS_READ_LIMITS = False
    ReadLimit = Any  # type: ignore[misc,assignment]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Placeholder on pyspark < 4.2."""


log = logging.getLogger(__name__)

__all__ = [
    "NAME",
    "PawnQueueDataSource",
    "QueueStreamReader",
    "QueueWriter",
    "SnapshotReader",
]

#: The format name: ``spark.read.format(NAME)``.
NAME = "pawnqueue"
SECTIONS = ("messages", "dead-letter")
#: Messages per streaming batch unless ``maxMessagesPerBatch`` says otherwise. Every
#: batch's keys are recorded in Spark's offset log, so this also bounds its entries.
DEFAULT_MAX_PER_BATCH = 1000
#: Keys fetched per read chunk (a partition's reads are done in chunks of this size).
_READ_CHUNK = 256

# -- one store per process (reads and stream bookkeeping need no lease machinery) -----------

_stores: dict[tuple[int, str], Store] = {}
_stores_lock = threading.Lock()


def store_for(settings: Settings) -> Store:
    """A store of this process for ``settings``: no capability probe, so a snapshot
    read works with read-only credentials."""
    key = (os.getpid(), settings.fingerprint)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            for stale in [k for k in _stores if k[0] != key[0]]:
                del _stores[stale]
            store = build_store(settings.config())
            _stores[key] = store
        return store


def _require_topic(store: Store, topic: str) -> None:
    layout.validate_topic(topic)
    try:
        store.head(layout.topic_marker_key(topic))
    except ObjectNotFound:
        raise TopicNotFoundError(topic) from None


_COMMON_OPTIONS = ("topic", "path", CONFIG_PATH_OPTION, *CONNECTION_OPTIONS)
_MODE_OPTIONS = {
    "read": ("section", "numPartitions", "readThreads"),
    "stream": ("section", "numPartitions", "readThreads", "maxMessagesPerBatch"),
    "write": ("payloadColumn", "idColumn", "createdAtColumn", "batchSize", "publishThreads",
              "producerName"),
}


def _check_options(options: dict[str, str], mode: str) -> None:
    """Refuse options this mode does not know (names only are shown, never values)."""
    import difflib

    known = [*_COMMON_OPTIONS, *_MODE_OPTIONS[mode]]
    by_lower = {k.lower(): k for k in known}
    for name in options:
        if name in UNREDACTED_OPTIONS:
            good = UNREDACTED_OPTIONS[name]
            raise ConfigError(name, f"use the option {good!r} instead: Spark shows {name!r} "
                              "in plans, unredacted")
        if name not in by_lower:
            close = difflib.get_close_matches(name, list(by_lower), n=1)
            hint = f"; did you mean {by_lower[close[0]]!r}?" if close else ""
            raise ConfigError(name, f"unknown option for a pawnqueue {mode}{hint} "
                              f"(known: {', '.join(known)})")


def _int_option(options: dict[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(name, f"option must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(name, f"option must be >= {minimum}, got {value}")
    return value


class _Keys(InputPartition):
    """One Spark partition: the message keys it reads."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(len(keys))
        self.keys = keys

    def __repr__(self) -> str:
        return f"_Keys({len(self.keys)} keys)"


def _fetch(store: Store, keys: list[str], threads: int) -> Iterator[tuple[str, bytes | None]]:
    """(key, body) for each key, fetched ``threads`` at a time; None if it is gone.
    The pool is shut down (joined) before this generator finishes or is closed."""

    def get(key: str) -> tuple[str, bytes | None]:
        try:
            return key, store.get(key).body
        except ObjectNotFound:
            return key, None

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="pawnq-spark-read") as pool:
        for i in range(0, len(keys), _READ_CHUNK):
            yield from pool.map(get, keys[i : i + _READ_CHUNK])


# -- the data source ----------------------------------------------------------------------------


class PawnQueueDataSource(DataSource):
    """``format("pawnqueue")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __repr__(self) -> str:
        topic = self.options.get("topic")
        return f"PawnQueueDataSource(topic={topic!r})"

    def _opts(self) -> dict[str, str]:
        return {str(k).lower(): v for k, v in self.options.items()}

    def _topic(self) -> str:
        topic = self._opts().get("topic")
        if not topic:
            raise ConfigError("topic", "the pawnqueue data source needs .option('topic', ...)")
        return layout.validate_topic(topic)

    def _section(self) -> str:
        section = self._opts().get("section", "messages")
        if section not in SECTIONS:
            raise ConfigError("section", f"must be one of {', '.join(SECTIONS)}, got {section!r}")
        return section

    def schema(self) -> str:
        return DEAD_LETTER_SCHEMA if self._section() == "dead-letter" else SNAPSHOT_SCHEMA

    def reader(self, schema: StructType) -> SnapshotReader:
        opts = self._opts()
        _check_options(opts, "read")
        return SnapshotReader(
            Settings.from_options(opts),
            self._topic(),
            self._section(),
            partitions=_int_option(opts, "numPartitions", 0, minimum=0),
            threads=_int_option(opts, "readThreads", 8),
        )

    def writer(self, schema: StructType, overwrite: bool) -> QueueWriter:
        if overwrite:
            raise ConfigError("mode", "the pawnqueue sink only appends: use .mode('append')")
        opts = self._opts()
        _check_options(opts, "write")
        return QueueWriter(Settings.from_options(opts), self._topic(), opts, list(schema.names))

    def streamReader(self, schema: StructType) -> QueueStreamReader:
        if not _HAS_READ_LIMITS:
            raise RuntimeError("the pawnqueue streaming source needs pyspark >= 4.2")
        if self._section() != "messages":
            raise ConfigError("section", "only the messages section can be streamed")
        opts = self._opts()
        _check_options(opts, "stream")
        return QueueStreamReader(
            Settings.from_options(opts),
            self._topic(),
            max_per_batch=_int_option(opts, "maxMessagesPerBatch", DEFAULT_MAX_PER_BATCH),
            partitions=_int_option(opts, "numPartitions", 2),
            threads=_int_option(opts, "readThreads", 8),
        )


# -- batch read: a non-destructive snapshot -------------------------------------------------------


class SnapshotReader(DataSourceReader):
    """Lists the topic's pending messages (or dead letters) when the query is planned
    and reads them in the executors. Nothing is claimed, acked or deleted: a snapshot
    for inspection and analytics. A message acked between listing and reading is
    skipped."""

    def __init__(
        self, settings: Settings, topic: str, section: str, *, partitions: int, threads: int
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.section = section
        self.num_partitions = partitions
        self.threads = threads

    def __repr__(self) -> str:
        return (f"SnapshotReader(topic={self.topic!r}, section={self.section!r}, "
                f"{self.settings.describe()})")

    def partitions(self) -> Sequence[InputPartition]:
        store = store_for(self.settings)
        _require_topic(store, self.topic)
        prefix = (layout.dead_letter_prefix(self.topic) if self.section == "dead-letter"
                  else layout.messages_prefix(self.topic))
        keys = [o.key for o in store.list(prefix).objects]
        if self.section == "messages":
            keys = [k for k in keys if layout.parse_message_key(self.topic, k) is not None]
        if not keys:
            return [_Keys([])]
        parts = self.num_partitions or min(16, math.ceil(len(keys) / 500))
        return [_Keys(chunk) for chunk in split_evenly(keys, parts)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Keys)
        if not partition.keys:
            return
        to_row = dead_letter_row if self.section == "dead-letter" else snapshot_row
        for key, body in _fetch(store_for(self.settings), partition.keys, self.threads):
            if body is not None:
                yield to_row(self.topic, key, decode_doc(body))


# -- batch write -----------------------------------------------------------------------------------


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
    ``producerName``.
    """

    def __init__(
        self, settings: Settings, topic: str, options: dict[str, str], columns: list[str]
    ) -> None:
        from .dataframe import _Publisher

        cols = {}
        for opt in ("payloadColumn", "idColumn", "createdAtColumn"):
            col = options.get(opt.lower())
            if col is not None and col not in columns:
                raise ConfigError(opt, f"no column {col!r} (columns: {columns})")
            cols[opt] = col
        self.settings = settings
        self.topic = topic
        self.published: int | None = None
        self.publisher = _Publisher(
            settings,
            topic,
            payload_col=cols["payloadColumn"],
            id_col=cols["idColumn"],
            created_at_col=cols["createdAtColumn"],
            default_created_at=datetime.now(timezone.utc),
            batch_size=_int_option(options, "batchSize", 500),
            threads=_int_option(options, "publishThreads", 8),
            producer_name=options.get("producername", "spark-writer"),
        )
        store = store_for(settings)
        _require_topic(store, topic)

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


# -- streaming read --------------------------------------------------------------------------------


def _name(topic: str, key: str) -> str:
    """``{topic}/messages/{name}.json`` -> ``name`` (what offsets record)."""
    return key[len(layout.messages_prefix(topic)) : -len(".json")]


def _key(topic: str, name: str) -> str:
    return f"{layout.messages_prefix(topic)}{name}.json"


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming source over one topic: the stream is the topic's only consumer.

    An offset is ``{"key": K, "keys": [...]}``: ``K`` is the highest message key (name)
    read so far, and ``keys`` the exact names of the batch that ends there, so a batch
    replayed after a failure reads the same messages, and deleting a batch never
    touches a message nobody read. Each batch takes, in key order, at most
    ``maxMessagesPerBatch`` messages that are pending and not in the previous batch:
    new keys above ``K`` and *stragglers* below it (a message whose publish finished
    after a later key had been read: concurrent producers, slow writes).

    Messages are deleted only once Spark has durably recorded a later batch: in
    ``commit(end)``, which Spark calls after writing the next batch's offsets (so one
    batch late), and, for a query restarted in between, when the next batch is planned
    (``partitions(start, end)`` deletes ``start``'s messages: its offsets were committed
    before ``end`` was written). The last batch of a query therefore stays in the topic
    until the query next runs a batch; a replay never sees a deleted message.
    """

    def __init__(
        self,
        settings: Settings,
        topic: str,
        *,
        max_per_batch: int,
        partitions: int,
        threads: int,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.max_per_batch = max_per_batch
        self.num_partitions = partitions
        self.threads = threads
        self._target: set[str] | None = None
        #: digests of the offsets whose messages this process deleted (oldest first, a
        #: few kept; see _mark)
        self._deleted: dict[str, None] = {}
        _require_topic(store_for(settings), topic)

    def __repr__(self) -> str:
        return f"QueueStreamReader(topic={self.topic!r}, {self.settings.describe()})"

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to every read task: leave the driver-side bookkeeping behind.
        state = dict(self.__dict__)
        state["_target"] = None
        state["_deleted"] = {}
        return state

    # -- offsets ------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        return {"key": "", "keys": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix what "available now" means: the messages pending at this moment."""
        self._target = set(self._pending(None))
        log.info("pawnqueue stream %r: available now: %d messages", self.topic,
                 len(self._target))

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        if start is None:  # pre-4.2 call shape; never used with the API we require
            raise RuntimeError("the pawnqueue streaming source needs pyspark >= 4.2")
        cap = self.max_per_batch
        if _HAS_READ_LIMITS and isinstance(limit, ReadMaxRows):
            cap = max(1, min(cap, limit.max_rows))
        elif _HAS_READ_LIMITS and not isinstance(limit, (ReadAllAvailable, type(None))):
            log.debug("pawnqueue stream: read limit %r treated as %d rows", limit, cap)
        previous = set(start["keys"])
        high = start["key"]
        listed = self._pending(len(previous) + cap + 1000)
        fresh = [n for n in listed if n > high or n not in previous]
        if self._target is not None:
            fresh = [n for n in fresh if n in self._target]
        take = sorted(fresh)[:cap]
        if not take:
            return start
        late = sum(1 for n in take if n <= high)
        if late:
            log.info("pawnqueue stream %r: %d straggler(s) below the offset", self.topic, late)
        return {"key": max(high, take[-1]), "keys": take}

    def _pending(self, limit: int | None) -> list[str]:
        store = store_for(self.settings)
        listing = store.list(layout.messages_prefix(self.topic), limit=limit)
        return [
            _name(self.topic, o.key)
            for o in listing.objects
            if layout.parse_message_key(self.topic, o.key) is not None
        ]

    # -- batches ------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._delete(start)  # committed before `end` was written: see the class docstring
        if start == end or not end["keys"]:
            return []
        keys = [_key(self.topic, n) for n in end["keys"]]
        return [_Keys(c) for c in split_evenly(keys, self.num_partitions)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Keys)
        for key, body in _fetch(store_for(self.settings), partition.keys, self.threads):
            if body is not None:
                yield snapshot_row(self.topic, key, decode_doc(body))
            else:  # only another consumer of the topic could have removed it
                log.warning("pawnqueue stream %r: %s vanished before it was read",
                            self.topic, key)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has recorded the batch after ``end``: ``end``'s messages are done."""
        self._delete(end)

    @staticmethod
    def _mark(offset: dict[str, Any]) -> str:
        """What identifies a batch whose messages were deleted: a digest of the offset's
        whole content, its high key and every key it holds. (The high key and a count
        would not do: a batch of stragglers below the high mark, as many as the batch
        before, ends at the same mark, and its delete would be skipped.)"""
        content = {"key": str(offset.get("key")), "keys": sorted(offset.get("keys") or [])}
        return hashlib.sha256(json.dumps(content, separators=(",", ":")).encode()).hexdigest()

    def _delete(self, offset: dict[str, Any]) -> None:
        """Delete ``offset``'s messages unless this process already did: Spark hands the
        same offset to commit(end) and then to partitions(start, ...), and deleting it
        twice could remove a message republished under the same key in between."""
        names = offset.get("keys") or []
        if not names:
            return
        mark = self._mark(offset)
        if mark in self._deleted:
            return
        try:
            failed = store_for(self.settings).delete_many([_key(self.topic, n) for n in names])
        except StorageError as exc:
            log.warning("pawnqueue stream %r: could not delete consumed messages: %s",
                        self.topic, exc)
            return
        if failed:  # they will be read again as stragglers: at-least-once
            log.warning("pawnqueue stream %r: could not delete %d consumed message(s)",
                        self.topic, len(failed))
            return
        self._deleted[mark] = None
        while len(self._deleted) > 64:
            del self._deleted[next(iter(self._deleted))]
        log.debug("pawnqueue stream %r: deleted %d consumed messages", self.topic, len(names))

    def stop(self) -> None:
        self._target = None
