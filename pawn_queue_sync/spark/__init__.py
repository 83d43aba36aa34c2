"""Spark integration: DataFrames to topics and back, and the ``pawnqueue`` data source.

Install with the ``spark`` extra (pyspark >= 4.2, which the streaming source needs, and
pyarrow; batch reads and writes also work on pyspark 4.0)::

    from pawn_queue_sync import spark as pqspark

    pqspark.publish_dataframe(df, "orders", config, id_col="order_id")
    result = pqspark.process_topic(spark, "orders", handle, config, partitions=4)
    df = pqspark.consume_to_dataframe(spark, "orders", config)

    pqspark.register(spark)
    spark.read.format("pawnqueue").option("topic", "orders").option(
        "configPath", "pawnqueue.yaml").load()

``config`` is anything :func:`pawn_queue_sync.load_config` takes; only plain settings
travel to the executors, which build one client per process. See ``docs/spark.md``.

Modules: :mod:`.publish`, :mod:`.process` and :mod:`.consume` (DataFrames to topics and
back); :mod:`.datasource` (the ``pawnqueue`` format) with :mod:`.snapshot`,
:mod:`.writer`, :mod:`.stream` and :mod:`.options`; :mod:`.settings` (what travels to
executors), :mod:`.queues` (one queue per process), :mod:`.rows` (conversions) and
:mod:`.tasks` (how work is split between tasks).
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pawn_queue_sync.spark needs pyspark: pip install 'pawn-queue-sync[spark]'"
    ) from exc

from typing import TYPE_CHECKING

from .consume import consume_to_dataframe
from .datasource import NAME, PawnQueueDataSource
from .process import ProcessResult, process_topic
from .publish import publish_dataframe
from .queues import executor_queue
from .settings import spark_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "NAME",
    "PawnQueueDataSource",
    "ProcessResult",
    "consume_to_dataframe",
    "executor_queue",
    "process_topic",
    "publish_dataframe",
    "register",
    "spark_options",
]


def register(spark: SparkSession) -> None:
    """Register the ``pawnqueue`` data source with ``spark`` (idempotent)."""
    spark.dataSource.register(PawnQueueDataSource)
