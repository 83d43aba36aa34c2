"""Topic -> processing: :func:`process_topic` runs N Spark tasks that each drain a topic
through a handler (:func:`pawn_queue_sync.runtime.drain`), acking after the handler
returned. Delivery is at-least-once; see ``docs/spark.md`` for exactly when acks happen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from ..queue.message import Message
from ..runtime.drain import drain
from ..runtime.options import Default, renamed_value
from .queues import queue_for, queue_for_driver
from .settings import ConfigSource, Settings
from .tasks import check_tasks, share, task_consumer_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = ["Handler", "ProcessResult", "process_topic"]

Handler = Callable[[Message], Any]


class ProcessResult(NamedTuple):
    """What :func:`process_topic` did, summed over its tasks (successful attempts).

    ``processed``: handler calls that returned (message acked); ``failed``: handler
    calls that raised and sent the message back for a retry; ``dead_lettered``:
    messages moved to dead-letter after their last allowed delivery failed.
    """

    processed: int
    failed: int
    dead_lettered: int


def process_topic(
    spark: SparkSession,
    topic: str,
    handler: Handler,
    config: ConfigSource,
    partitions: int = 2,
    max_messages: int | None = None,
    idle_timeout_seconds: float = Default(5.0),
    *,
    threads: int = 8,
    consumer_name: str = "spark-process-topic",
    idle_timeout_s: float | None = None,
) -> ProcessResult:
    """Run ``partitions`` Spark tasks that each consume ``topic`` and call
    ``handler(message)`` on ``threads`` threads until the topic has been idle for
    ``idle_timeout_seconds`` (or the task's share of ``max_messages`` was handled).
    ``idle_timeout_s`` is its deprecated name (a DeprecationWarning).

    A message is acked only after ``handler`` returned; a handler that raises sends it
    back for a retry, and after ``polling.max_delivery_count`` deliveries it is
    dead-lettered with the error. Each task runs :func:`pawn_queue_sync.runtime.drain`,
    which joins all its threads before the task ends. If a task dies, the messages it
    held reappear after their lease (``polling.visibility_timeout_seconds``) and are
    delivered again (at-least-once). Counts come from successful task attempts.
    """
    idle_timeout_seconds = float(renamed_value("idle_timeout_s", idle_timeout_s,
                                               "idle_timeout_seconds", idle_timeout_seconds))
    check_tasks(consumer_name, partitions)
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
            idle_timeout_seconds=idle_timeout_seconds,
            threads=threads,
        )
        yield (result.processed, result.failed, result.dead_lettered)

    rdd = spark.sparkContext.parallelize(range(partitions), partitions)
    counts = rdd.mapPartitionsWithIndex(run).collect()
    result = ProcessResult(*(sum(c[i] for c in counts) for i in range(3)))
    log.info("process_topic(%r): %s", topic, result)
    return result
