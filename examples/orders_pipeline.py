"""An orders pipeline on Spark with pawn-queue-sync (see docs/spark.md).

1. a DataFrame of orders is published to the topic ``orders`` (deterministic ids, so a
   retried Spark task overwrites instead of duplicating);
2. ``process_topic`` validates every order in the executors: good orders are forwarded
   to ``orders-valid``; a bad one makes the handler raise, is retried, and ends up in
   ``orders``' dead-letter section;
3. a streaming job (``trigger(availableNow=True)``, with a checkpoint) reads
   ``orders-valid`` through the ``pawnqueue`` source and appends the parsed orders to
   Parquet (exactly once: the file sink is idempotent per batch);
4. a batch job aggregates revenue per customer into Parquet;
5. the dead letters are inspected with Spark SQL.

Run it against the local store (nothing to set up)::

    python examples/orders_pipeline.py --out /tmp/orders-demo-local

or against S3 with a configuration file (or the PAWNQUEUE_* variables)::

    python examples/orders_pipeline.py --config pawnqueue.yaml --out /tmp/orders-demo-s3

An output directory belongs to one store: its streaming checkpoint records which
messages of *that* store's topic were read, so pointed at another store it would read
nothing. The pipeline refuses an ``--out`` used with another store.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pawn_queue_sync import Message, PawnQueue, load_config
from pawn_queue_sync.spark import (
    ProcessResult,
    executor_queue,
    process_topic,
    publish_dataframe,
    register,
    spark_options,
)

ORDERS = "orders"
VALID = "orders-valid"
ORDER_SCHEMA = "order_id STRING, customer STRING, amount DOUBLE, placed_at TIMESTAMP"


def make_orders(spark: SparkSession, n: int) -> DataFrame:
    """``n`` synthetic orders; every 25th has a negative amount (invalid)."""
    return spark.range(n).select(
        F.format_string("order-%05d", "id").alias("order_id"),
        F.format_string("customer-%d", F.col("id") % 7).alias("customer"),
        F.when(F.col("id") % 25 == 24, F.lit(-1.0))
        .otherwise(F.round(F.col("id") % 100 * 1.25 + 5, 2))
        .alias("amount"),
        (F.lit("2026-01-01 00:00:00").cast("timestamp")
         + F.make_interval(secs=F.col("id").cast("int"))).alias("placed_at"),
    )


def make_validator(config: dict[str, Any]) -> Any:
    """The handler run in the executors: forward good orders, reject bad ones."""

    def validate(msg: Message) -> None:
        order = msg.payload
        if not isinstance(order.get("amount"), (int, float)) or order["amount"] <= 0:
            raise ValueError(f"order {order.get('order_id')}: amount must be > 0")
        producer = executor_queue(config).register_producer("order-validator")
        # The incoming id and time make the key: a redelivery overwrites, never duplicates.
        producer.publish(VALID, order, message_id=msg.id, created_at=msg.created_at_datetime)

    return validate


def claim_output(out: str, store: str) -> None:
    """Mark ``out`` as the output of ``store`` (its description, no secrets), or raise
    ValueError if an earlier run wrote it for another store."""
    marker = Path(out) / "STORE"
    if marker.exists() and marker.read_text(encoding="utf-8") != store:
        raise ValueError(
            f"{out} holds the output and streaming checkpoint of another store "
            f"({marker.read_text(encoding='utf-8')}); choose another --out"
        )
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(store, encoding="utf-8")


def run_pipeline(
    spark: SparkSession, config: dict[str, Any], out: str, n_orders: int = 500
) -> dict[str, Any]:
    """Run the five steps; returns what each produced (for tests and the summary)."""
    register(spark)
    with PawnQueue.from_config(config) as pq:
        claim_output(out, pq.store.describe())
        pq.create_topic(ORDERS)
        pq.create_topic(VALID)
    options = spark_options(config)

    # 1. DataFrame -> topic
    published = publish_dataframe(make_orders(spark, n_orders), ORDERS, config,
                                  id_col="order_id", created_at_col="placed_at")

    # 2. validation in the executors (bad orders: retried, then dead-lettered)
    checked: ProcessResult = process_topic(
        spark, ORDERS, make_validator(config), config, partitions=4, idle_timeout_seconds=2.0
    )

    # 3. streaming: topic -> Parquet, exactly once through the checkpoint
    stream = (spark.readStream.format("pawnqueue").option("topic", VALID)
              .options(**options).load())
    orders = stream.select(F.from_json("payload", ORDER_SCHEMA).alias("o"), "id").select(
        "id", "o.*")
    query = (orders.writeStream.format("parquet")
             .option("path", f"{out}/orders")
             .option("checkpointLocation", f"{out}/checkpoints/orders")
             .trigger(availableNow=True).start())
    query.awaitTermination()

    # 4. batch: aggregate what has landed
    revenue = (spark.read.parquet(f"{out}/orders").dropDuplicates(["id"])
               .groupBy("customer")
               .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
               .orderBy("customer"))
    revenue.write.mode("overwrite").parquet(f"{out}/revenue_by_customer")

    # 5. the dead letters, with Spark SQL
    (spark.read.format("pawnqueue").option("topic", ORDERS).option("section", "dead-letter")
     .options(**options).load().createOrReplaceTempView("orders_dead_letter"))
    rejected = spark.sql("""
        SELECT get_json_object(payload, '$.order_id') AS order_id,
               CAST(get_json_object(payload, '$.amount') AS DOUBLE) AS amount,
               delivery_count,
               split(reason, '\\n')[0] AS reason
        FROM orders_dead_letter
        ORDER BY order_id
    """)
    return {
        "published": published,
        "checked": checked,
        "revenue": spark.read.parquet(f"{out}/revenue_by_customer").orderBy("customer"),
        "rejected": rejected,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="pawn-queue-sync YAML file (else PAWNQUEUE_*)")
    parser.add_argument("--out", default="./orders-demo", help="output directory")
    parser.add_argument("--orders", type=int, default=500, help="orders to publish")
    args = parser.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Plain settings travel to the executors; a short poll interval suits a demo.
    config = load_config(args.config).to_dict()
    config["polling"].update(interval_seconds=0.5, max_delivery_count=3)
    out = str(Path(args.out).resolve())
    spark = (SparkSession.builder.master("local[2]").appName("orders-pipeline")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        try:
            result = run_pipeline(spark, config, out, args.orders)
        except ValueError as exc:
            print(f"orders_pipeline: {exc}", file=sys.stderr)
            return 2
        print(f"published {result['published']} orders; validation: {result['checked']}")
        print("revenue by customer:")
        result["revenue"].show(truncate=False)
        print("dead-lettered orders:")
        result["rejected"].show(truncate=False)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
