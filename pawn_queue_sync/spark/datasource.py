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

The readers and the writer live in :mod:`.snapshot`, :mod:`.stream` and :mod:`.writer`;
the options in :mod:`.options`. The streaming semantics (offsets, when messages are
deleted, stragglers) are described on
:class:`~pawn_queue_sync.spark.stream.QueueStreamReader` and in ``docs/spark.md``.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .. import layout
from ..errors import ConfigError
from .options import check_options, int_option
from .rows import DEAD_LETTER_SCHEMA, SNAPSHOT_SCHEMA
from .settings import Settings
from .snapshot import SnapshotReader
from .stream import DEFAULT_MAX_PER_BATCH, HAS_READ_LIMITS, QueueStreamReader
from .writer import QueueWriter

#: The readers and the writer stay importable from here, as before they had modules
#: of their own.
__all__ = [
    "NAME",
    "SECTIONS",
    "PawnQueueDataSource",
    "QueueStreamReader",
    "QueueWriter",
    "SnapshotReader",
]

#: The format name: ``spark.read.format(NAME)``.
NAME = "pawnqueue"
SECTIONS = ("messages", "dead-letter")


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
        check_options(opts, "read")
        return SnapshotReader(
            Settings.from_options(opts),
            self._topic(),
            self._section(),
            partitions=int_option(opts, "numPartitions", 0, minimum=0),
            threads=int_option(opts, "readThreads", 8),
        )

    def writer(self, schema: StructType, overwrite: bool) -> QueueWriter:
        if overwrite:
            raise ConfigError("mode", "the pawnqueue sink only appends: use .mode('append')")
        opts = self._opts()
        check_options(opts, "write")
        return QueueWriter(Settings.from_options(opts), self._topic(), opts, list(schema.names))

    def streamReader(self, schema: StructType) -> QueueStreamReader:
        if not HAS_READ_LIMITS:
            raise RuntimeError("the pawnqueue streaming source needs pyspark >= 4.2")
        if self._section() != "messages":
            raise ConfigError("section", "only the messages section can be streamed")
        opts = self._opts()
        check_options(opts, "stream")
        return QueueStreamReader(
            Settings.from_options(opts),
            self._topic(),
            max_per_batch=int_option(opts, "maxMessagesPerBatch", DEFAULT_MAX_PER_BATCH),
            partitions=int_option(opts, "numPartitions", 2),
            threads=int_option(opts, "readThreads", 8),
        )
