"""pawn_queue_sync.spark on packed topics (issue 14), against a real SeaweedFS in the
session's local SparkSession: publish_dataframe writes segments (deterministic ones with
an id column, so a retried task rewrites them), process_topic and consume_to_dataframe
consume them, the ``pawnqueue`` data source reads (batch and streaming) and writes them.

Deliveries are counted per message id from the files handlers write; topics are checked
through ``topic_stats`` (segment counts come from the keys) and by listing.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow  # noqa: F401  (the Data Source API needs it: fail loudly, never skip)
import pytest
from pyspark.sql import SparkSession

from pawn_queue_sync import PawnQueue, layout
from pawn_queue_sync.spark import (
    ProcessResult,
    consume_to_dataframe,
    process_topic,
    publish_dataframe,
    spark_options,
)
from pawn_queue_sync.spark.publish import Publisher
from pawn_queue_sync.spark.settings import Settings
from pawn_queue_sync.spark.snapshot import SnapshotReader
from pawn_queue_sync.spark.stream import QueueStreamReader
from tests.servers import S3Server, config_dict
from tests.test_spark import FAST_POLLING, deliveries, run_available_now, stats

#: One JVM serves every Spark test: under pytest-xdist they run in one worker.
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-2")]

#: The time a retried task's rows share when they have no time column of their own.
WHEN = datetime(2026, 4, 1, tzinfo=timezone.utc)

#: Small segments, so a few hundred rows make many of them.
SMALL_SEGMENTS = {"max_segment_messages": 50}


@pytest.fixture
def cfg(real_s3: S3Server, real_bucket: str) -> dict[str, Any]:
    """A fresh SeaweedFS bucket, fast polling, segments of at most 50 messages."""
    return config_dict(real_s3, real_bucket, polling=FAST_POLLING, publishing=SMALL_SEGMENTS)


def packed_topic(cfg: dict[str, Any], topic: str, payloads: list[Any] | None = None) -> None:
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic(topic, packed=True)
        if payloads:
            pq.register_producer("test").publish_batch(topic, payloads)


def keys(cfg: dict[str, Any], prefix: str) -> list[str]:
    with PawnQueue.from_config(cfg) as pq:
        return [o.key for o in pq.store.list(prefix).objects]


def test_publish_dataframe_writes_segments_and_process_topic_handles_each_row_once(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path
) -> None:
    packed_topic(cfg, "p-work")
    df = spark.range(1000).selectExpr("id AS n", "CAST(id % 7 AS INT) AS k").repartition(4)
    assert publish_dataframe(df, "p-work", cfg) == 1000
    assert keys(cfg, "p-work/messages/") == []  # no single-message objects
    before = stats(cfg, "p-work")
    assert before["packed"] is True and before["pending"] == 1000
    assert before["segment_messages"] == 1000 and before["segments"] >= 20  # <= 50 each

    out = str(tmp_path)

    def handler(msg: Any) -> None:
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        with open(os.path.join(out, f"{msg.id}.{part}.{uuid.uuid4().hex}"), "w") as f:
            f.write(json.dumps(msg.payload))

    result = process_topic(spark, "p-work", handler, cfg, partitions=4, idle_timeout_seconds=1.0)
    assert result == ProcessResult(processed=1000, failed=0, dead_lettered=0)
    seen = deliveries(tmp_path)
    assert len(seen) == 1000 and set(seen.values()) == {1}
    payloads = []
    for name in os.listdir(tmp_path):
        with open(os.path.join(out, name)) as f:
            payloads.append(json.load(f)["n"])
    assert sorted(payloads) == list(range(1000))
    after = stats(cfg, "p-work")
    assert after["pending"] == 0 and after["segments"] == 0 and after["segments_leased"] == 0


def test_publish_dataframe_with_ids_rewrites_the_same_segments(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    """With an id column a retried task (here: the whole job again, as every task of it
    would) writes byte-identical segments under the same keys instead of adding new
    ones: the queue holds each row once."""
    packed_topic(cfg, "p-idem")
    df = spark.range(300).selectExpr(
        "CONCAT('order-', id) AS order_id", "id AS n",
        "TIMESTAMP'2026-03-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) AS ts",
    ).repartition(3)
    assert publish_dataframe(df, "p-idem", cfg, id_col="order_id", created_at_col="ts") == 300
    first = keys(cfg, "p-idem/segments/")
    with PawnQueue.from_config(cfg) as pq:
        bodies = {k: pq.store.get(k).body for k in first}
    assert publish_dataframe(df, "p-idem", cfg, id_col="order_id", created_at_col="ts") == 300
    assert keys(cfg, "p-idem/segments/") == first
    with PawnQueue.from_config(cfg) as pq:
        assert {k: pq.store.get(k).body for k in first} == bodies
    got = stats(cfg, "p-idem")
    assert got["segment_messages"] == 300 and got["pending"] == 300
    assert min(first).startswith("p-idem/segments/20260301T000000_000000-")


def test_publisher_retried_partition_rewrites_its_segments(cfg: dict[str, Any]) -> None:
    """One partition's rows published twice by the executor-side Publisher (what a
    retried task runs), without Spark: the same segment keys, nothing added; without an
    id column the second run adds a second copy (documented: duplicates)."""
    from pyspark.sql import Row

    packed_topic(cfg, "p-retry")
    rows = [Row(name=f"r{i}", n=i) for i in range(120)]

    def publisher(id_col: str | None) -> Publisher:
        return Publisher(Settings(cfg), "p-retry", payload_col=None, id_col=id_col,
                         created_at_col=None, default_created_at=WHEN, batch_size=500,
                         threads=4, producer_name="spark-publisher", packed=True)

    with_ids = publisher("name")
    assert with_ids.publish(rows) == 120
    first = keys(cfg, "p-retry/segments/")
    assert len(first) == 3  # 120 rows, 50 a segment
    assert with_ids.publish(rows) == 120
    assert keys(cfg, "p-retry/segments/") == first
    assert stats(cfg, "p-retry")["segment_messages"] == 120

    assert publisher(None).publish(rows) == 120
    assert stats(cfg, "p-retry")["segment_messages"] == 240


def test_rows_with_the_same_id_never_make_a_corrupt_segment(cfg: dict[str, Any]) -> None:
    """Rows repeating an id column value: on a plain topic a later row with the same id
    and time overwrites the earlier one (same key), with another time it is a message of
    its own. A segment repeating an id would be corrupt (the whole segment quarantined):
    the packed path keeps the last row of each (id, time) and never puts one id twice
    in a segment."""
    from pyspark.sql import Row

    packed_topic(cfg, "p-dup")
    rows = [Row(name=f"r{i % 4}", n=i, ts=WHEN + timedelta(seconds=i // 8))
            for i in range(12)]
    publisher = Publisher(Settings(cfg), "p-dup", payload_col=None, id_col="name",
                          created_at_col="ts", default_created_at=WHEN, batch_size=500,
                          threads=4, producer_name="spark-publisher", packed=True)
    assert publisher.publish(rows) == 12
    segments = [layout.parse_segment_key("p-dup", k) for k in keys(cfg, "p-dup/segments/")]
    assert len(segments) == 2 and len({sid for sid, _ in segments}) == 2  # leases apart
    with PawnQueue.from_config(cfg) as pq:
        consumer = pq.register_consumer("c", ["p-dup"])
        got = []
        while batch := consumer.poll(20):
            consumer.ack_many(batch)
            got += batch
        assert pq.topic_stats("p-dup")["dead_letter"] == 0
    # 0-3 overwritten by 4-7 (same ids, same time); 8-11 have a later time
    assert sorted(m.payload["n"] for m in got) == list(range(4, 12))
    assert len({m.id for m in got}) == 4


def test_consume_to_dataframe_on_a_packed_topic(
    spark: SparkSession, real_s3: S3Server, real_bucket: str, tmp_path: Path
) -> None:
    cfg = config_dict(real_s3, real_bucket, publishing=SMALL_SEGMENTS, polling={
        **FAST_POLLING, "visibility_timeout_seconds": 300.0})
    packed_topic(cfg, "p-c2df", [{"i": i} for i in range(120)])

    def refuse(df: Any) -> None:
        raise RuntimeError("sink unavailable")

    with pytest.raises(RuntimeError, match="sink unavailable"):
        consume_to_dataframe(spark, "p-c2df", cfg, max_messages=50, before_ack=refuse)
    assert stats(cfg, "p-c2df")["pending"] == 120  # released, not acked

    df = consume_to_dataframe(spark, "p-c2df", cfg, max_messages=100,
                              before_ack=lambda d: d.write.parquet(str(tmp_path / "out")))
    assert df.columns == ["id", "topic", "producer_id", "created_at", "payload"]
    rows = df.collect()
    assert len(rows) == 100 and len({r.id for r in rows}) == 100
    assert spark.read.parquet(str(tmp_path / "out")).count() == 100
    assert stats(cfg, "p-c2df")["pending"] == 20

    rest = consume_to_dataframe(spark, "p-c2df", cfg, max_messages=None).collect()
    taken = {json.loads(r.payload)["i"] for r in rows}
    assert sorted(json.loads(r.payload)["i"] for r in rest) == sorted(set(range(120)) - taken)
    assert stats(cfg, "p-c2df")["pending"] == 0


def test_snapshot_read_of_a_packed_topic_leaves_out_settled_messages(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    """A batch read lists segments and single messages; the messages a segment's lease
    recorded settled (acked, dead-lettered) are not rows, and nothing is consumed."""
    packed_topic(cfg, "p-snap", [{"i": i} for i in range(100)])
    with PawnQueue.from_config(cfg) as pq:  # a single message left from before packing
        pq.store.put(layout.message_key("p-snap", "20260101T000000_000000",
                                        "00000000-0000-4000-8000-000000000001"),
                     layout.canonical_json({"id": "00000000-0000-4000-8000-000000000001",
                                            "topic": "p-snap", "producer_id": None,
                                            "created_at": "2026-01-01T00:00:00+00:00",
                                            "payload": {"i": "single"}}))
        consumer = pq.register_consumer("settler", ["p-snap"])
        got = consumer.poll(8)
        assert len(got) == 8
        for msg in got[:5]:
            msg.nack("bad data")
        for msg in got[5:]:
            msg.ack()
        assert consumer.close()  # gives its segments back, their progress kept
    settled = {json.dumps(m.payload, separators=(",", ":"), sort_keys=True) for m in got}
    assert stats(cfg, "p-snap")["pending"] == 101 - 8

    reader = spark.read.format("pawnqueue").option("topic", "p-snap").options(
        **spark_options(cfg))
    rows = reader.load().collect()
    assert len(rows) == 93
    payloads = [r.payload for r in rows]
    assert len(set(payloads)) == 93 and settled.isdisjoint(payloads)
    assert {json.loads(p)["i"] for p in payloads} == (
        ({*range(100), "single"}) - {m.payload["i"] for m in got})
    assert all(r.key.startswith(("p-snap/segments/", "p-snap/messages/")) for r in rows)
    assert stats(cfg, "p-snap")["pending"] == 93  # a snapshot consumes nothing
    dead = reader.option("section", "dead-letter").load().collect()
    assert len(dead) == 5 and {r.reason for r in dead} == {"bad data"}


def test_stream_available_now_reads_segments_once_and_deletes_them(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path
) -> None:
    packed_topic(cfg, "p-events", [{"i": i} for i in range(200)])  # 4 segments of 50
    checkpoint = str(tmp_path / "checkpoint")
    batches: list[list[int]] = []

    def collect(batch_df: Any, batch_id: int) -> None:  # runs on the driver
        batches.append([json.loads(r.payload)["i"] for r in batch_df.collect()])

    run_available_now(spark, cfg, "p-events", 120, checkpoint, collect)
    # whole segments: 100 (a third would pass 120), then the other 100
    assert [len(b) for b in batches] == [100, 100]
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert stats(cfg, "p-events")["segment_messages"] == 100  # the last batch waits

    batches.clear()
    packed_topic(cfg, "p-events", [{"i": i} for i in range(200, 230)])
    run_available_now(spark, cfg, "p-events", 120, checkpoint, collect)
    assert sorted(i for b in batches for i in b) == list(range(200, 230))
    assert stats(cfg, "p-events")["segment_messages"] == 30


def test_write_to_a_packed_topic_with_ids_twice_holds_each_row_once(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    packed_topic(cfg, "p-sink")
    df = spark.range(200).selectExpr(
        "CONCAT('k', id) AS name", "id", "TIMESTAMP'2026-05-01 00:00:00' AS ts").coalesce(2)
    writer = (df.write.format("pawnqueue").option("topic", "p-sink").options(
        **spark_options(cfg)).option("idColumn", "name").option("createdAtColumn", "ts")
        .mode("append"))
    writer.save()
    first = keys(cfg, "p-sink/segments/")
    writer.save()
    assert keys(cfg, "p-sink/segments/") == first
    got = stats(cfg, "p-sink")
    assert got["segment_messages"] == 200 and keys(cfg, "p-sink/messages/") == []


def test_readers_give_a_corrupt_segment_as_one_row_and_skip_foreign_objects(
    cfg: dict[str, Any]
) -> None:
    """The batch and streaming readers, driven by hand (no Spark): a segment that cannot
    be decoded is one row of its key saying why (the query goes on), and objects under
    ``segments/`` that are not segments are not read."""
    packed_topic(cfg, "p-bad", [{"i": i} for i in range(3)])
    corrupt = layout.segment_key("p-bad", "20000101T000000_000000", str(uuid.uuid4()), 2)
    with PawnQueue.from_config(cfg) as pq:
        pq.store.put(corrupt, b"\xff not a segment")
        pq.store.put("p-bad/segments/notes.txt", b"hello")
    settings = Settings(cfg)
    snapshot = SnapshotReader(settings, "p-bad", "messages", partitions=2, threads=2)
    stream = QueueStreamReader(settings, "p-bad", max_per_batch=100, partitions=2, threads=2)
    end = stream.latestOffset(stream.initialOffset(), None)
    for rows in ([r for p in snapshot.partitions() for r in snapshot.read(p)],
                 [r for p in stream.partitions(stream.initialOffset(), end)
                  for r in stream.read(p)]):
        bad = [r for r in rows if r[5] == corrupt]
        assert len(bad) == 1 and bad[0][4] is None
        assert bad[0][7].startswith("malformed segment: ") and "UTF-8" in bad[0][7]
        assert sorted(json.loads(r[4])["i"] for r in rows if r[5] != corrupt) == [0, 1, 2]
        assert all(r[5] != "p-bad/segments/notes.txt" for r in rows)
