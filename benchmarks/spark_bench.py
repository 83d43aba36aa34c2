"""Spark on ``local[2]`` (issue 14): ``publish_dataframe`` of N rows to a packed topic,
then ``process_topic`` of them, against a plain topic in the same run.

A plain topic of 100,000 would take minutes (one PUT per row to publish, ~2 requests
per message to consume), so the plain one is measured on fewer rows (5,000 in a full
run) and the rows compare rates (messages per second of wall time around each call,
Spark's job overhead included). Rows are ~1 KiB: a ``seq`` and a 1,000-character pad.
``process_topic`` runs 2 tasks (``partitions=2``, 8 threads each) with
``max_messages`` = N, so it ends when all N were handled, not on an idle timeout.
Request counts are not taken here (the requests are sent by Spark's Python workers);
the other packed rows give them per operation.

Runs only with ``--spark``, ``--only spark`` or in a full run (the JVM start takes
10-20 s before anything is measured).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from functools import partial
from typing import Any

from benchmarks.packed import PACKED, PLAIN, PackedRun, loadavg

log = logging.getLogger("benchmarks")

PAD = 1000


def _session(workdir: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need this venv
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return (SparkSession.builder.master("local[2]")
            .appName("pawn-queue-sync-benchmark")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.python.worker.reuse", "true")
            .config("spark.local.dir", workdir)
            .getOrCreate())


def run_spark(packed_run: PackedRun) -> None:
    """Measure both kinds of topic; rows go to ``packed_run.rows``."""
    try:
        import pyspark  # noqa: F401

        from pawn_queue_sync import spark as pqspark
    except ImportError as exc:
        packed_run.rows.append({"scenario": "spark_publish_dataframe", "lib": PACKED,
                                "absent": f"pyspark is not installed: {exc}"})
        return
    bench = packed_run.bench
    counts = packed_run.size["spark"]
    workdir = tempfile.mkdtemp(prefix="pqs-bench-spark-", dir=str(bench.workdir))
    t0 = time.monotonic()
    spark = _session(workdir)
    log.info("Spark session up in %.1f s", time.monotonic() - t0)
    try:
        config = packed_run.config()
        # warm up: start the Python workers and their clients (not measured), so that
        # the first measured call does not pay for them
        warm = bench.topic("spark-warmup")
        packed_run.make_topic(warm, PLAIN)
        pqspark.publish_dataframe(spark.range(0, 4, numPartitions=2), warm, config)
        pqspark.process_topic(spark, warm, lambda m: None, config, partitions=2,
                              max_messages=4, idle_timeout_seconds=5.0)
        log.info("Spark warmed up in %.1f s", time.monotonic() - t0)
        for kind in (PACKED, PLAIN):
            n = counts[kind]
            topic = bench.topic(f"spark-{kind}")
            packed_run.make_topic(topic, kind)
            df = spark.range(0, n, numPartitions=2).selectExpr(
                "id AS seq", f"repeat('x', {PAD}) AS pad")
            df.cache().count()  # build the rows before the clock starts
            if kind == PACKED:  # the floor under publish_dataframe: rows to JSON, no store
                _measure(packed_run, "spark_rows_to_json", kind, n,
                         partial(_rows_to_json, df))
            _measure(packed_run, "spark_publish_dataframe", kind, n,
                     partial(pqspark.publish_dataframe, df, topic, config))
            _measure(packed_run, "spark_process_topic", kind, n,
                     partial(pqspark.process_topic, spark, topic, lambda m: None, config,
                             partitions=2, max_messages=n, idle_timeout_seconds=5.0))
            df.unpersist()
    finally:
        spark.stop()


def _rows_to_json(df: Any) -> int:
    """Each row to its JSON text in the Python workers (what publish_dataframe does
    before any store call); returns the rows seen."""

    def encode(rows: Any) -> Any:
        import json

        yield sum(1 for r in rows if json.dumps(r.asDict(), separators=(",", ":")))

    return int(sum(df.rdd.mapPartitions(encode).collect()))


def _measure(packed_run: PackedRun, scenario: str, kind: str, n: int, call: Any) -> None:
    """Time one Spark call (wall clock around it) and add its row."""
    t = time.perf_counter()
    result = call()
    took = time.perf_counter() - t
    done = result if isinstance(result, int) else result.processed
    how = {"spark_publish_dataframe": "publish_dataframe(df, topic, config), 2 partitions",
           "spark_process_topic": "process_topic(partitions=2, threads=8, max_messages=N), "
                                  "trivial handler",
           "spark_rows_to_json": "no store: each row to JSON text in the Python workers "
                                 "(df.rdd.mapPartitions), the floor under publish_dataframe",
           }[scenario]
    row = {"scenario": scenario, "lib": kind, "messages": done, "published": n,
           "seconds": took, "msgs_per_s": done / took, "mode": how, "result": str(result),
           "loadavg": loadavg(), "payload_bytes": PAD + 20}
    packed_run.rows.append(row)
    log.info("%-24s %-6s %7d msgs %6.1f s %9.1f msg/s (%s)", scenario, kind, done, took,
             row["msgs_per_s"], result)
