"""pawn_queue_sync.spark against a real SeaweedFS, in the session's one local SparkSession
(the ``spark`` fixture of tests/conftest.py).

Deliveries are counted per message id (handlers write one file per delivery into a
temporary directory the local executors share), and topics are checked by listing.
Handlers are nested functions so cloudpickle ships them by value.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow  # noqa: F401  (the Data Source API needs it: fail loudly, never skip)
import pytest
from pyspark.sql import SparkSession

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.errors import ConfigError
from pawn_queue_sync.queue.registry import stable_id
from pawn_queue_sync.spark import (
    ProcessResult,
    consume_to_dataframe,
    process_topic,
    publish_dataframe,
    spark_options,
)
from pawn_queue_sync.spark.datasource import PawnQueueDataSource
from pawn_queue_sync.spark.queues import PerProcess
from pawn_queue_sync.spark.settings import Settings
from pawn_queue_sync.spark.stream import QueueStreamReader
from pawn_queue_sync.spark.writer import QueueWriter, _Published
from tests.servers import LEAK_CHECK_ACCESS_KEY, LEAK_CHECK_SECRET_KEY, S3Server, config_dict

#: One JVM serves every Spark test: under pytest-xdist they run in one worker.
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

#: Fast polling: tests wait on idle timeouts, so keep every pause short.
FAST_POLLING = {"interval_seconds": 0.2, "jitter_max_ms": 0, "max_delivery_count": 3}


@pytest.fixture
def cfg(real_s3: S3Server, real_bucket: str) -> dict[str, Any]:
    """Configuration for a fresh SeaweedFS bucket, with fast polling."""
    return config_dict(real_s3, real_bucket, polling=FAST_POLLING)


def make_topic(cfg: dict[str, Any], topic: str, payloads: list[Any] | None = None) -> None:
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic(topic)
        if payloads:
            pq.register_producer("test").publish_batch(topic, payloads, threads=16)


def run_available_now(spark: SparkSession, cfg: dict[str, Any], topic: str, per_batch: int,
                      checkpoint: str, collect: Callable[[Any, int], None]) -> None:
    """One availableNow run of a pawnqueue stream of *topic* (*per_batch* messages a
    batch) into ``foreachBatch(collect)``, checkpointed at *checkpoint*; the query must
    end without an exception."""
    stream = (spark.readStream.format("pawnqueue").option("topic", topic)
              .options(**spark_options(cfg)).option("maxMessagesPerBatch", str(per_batch))
              .load())
    query = (stream.writeStream.foreachBatch(collect)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None


def stats(cfg: dict[str, Any], topic: str) -> dict[str, int]:
    with PawnQueue.from_config(cfg) as pq:
        return pq.topic_stats(topic)


def pending_payloads(cfg: dict[str, Any], topic: str) -> list[Any]:
    from concurrent.futures import ThreadPoolExecutor

    with PawnQueue.from_config(cfg) as pq:
        store = pq.store
        keys = [o.key for o in store.list(f"{topic}/messages/").objects]
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda k: json.loads(store.get(k).body)["payload"], keys))


def deliveries(out: Path) -> Counter[str]:
    """Deliveries per message id, from the files handlers wrote."""
    return Counter(name.split(".")[0] for name in os.listdir(out))


def task_pids(spark: SparkSession) -> set[int]:
    sc = spark.sparkContext
    return set(sc.parallelize(range(4), 4).mapPartitions(lambda _: [os.getpid()]).collect())


@contextlib.contextmanager
def worker_reuse(spark: SparkSession, reuse: bool) -> Iterator[None]:
    """Set ``spark.python.worker.reuse`` on the running context (read per task by the
    Python runners in local mode), restoring it afterwards."""
    conf = spark.sparkContext._jsc.sc().conf()  # the live SparkConf, not a copy
    before = conf.get("spark.python.worker.reuse", "true")
    conf.set("spark.python.worker.reuse", "true" if reuse else "false")
    try:
        yield
    finally:
        conf.set("spark.python.worker.reuse", before)


# -- DataFrame -> topic ------------------------------------------------------------------------


def test_publish_dataframe_publishes_every_row_once(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    make_topic(cfg, "orders")
    df = spark.range(2000).selectExpr(
        "id AS order_id", "CAST(id % 7 AS INT) AS customer", "CAST(id AS DOUBLE) * 1.5 AS amount",
        "TIMESTAMP'2026-01-02 03:04:05' AS placed_at",
    ).repartition(4)
    started = datetime.now()
    n = publish_dataframe(df, "orders", cfg, batch_size=250, threads=8)
    elapsed = (datetime.now() - started).total_seconds()
    sys.stderr.write(f"\npublished {n} rows from Spark in {elapsed:.1f} s "
                     f"({n / elapsed:.0f} msg/s)\n")
    assert n == 2000
    assert stats(cfg, "orders")["pending"] == 2000
    payloads = pending_payloads(cfg, "orders")
    assert sorted(p["order_id"] for p in payloads) == list(range(2000))
    sample = next(p for p in payloads if p["order_id"] == 10)
    assert sample["customer"] == 3 and sample["amount"] == 15.0
    assert sample["placed_at"].startswith("2026-01-02T03:04:05")


def test_publish_dataframe_with_deterministic_ids_overwrites(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    """Same id column and created_at column: publishing again (as a retried task does)
    rewrites the same keys instead of adding messages."""
    make_topic(cfg, "idem")
    df = spark.range(300).selectExpr(
        "CONCAT('order-', id) AS order_id", "id AS n",
        "TIMESTAMP'2026-03-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) AS ts",
    ).repartition(3)
    for _ in range(2):
        assert publish_dataframe(df, "idem", cfg, id_col="order_id", created_at_col="ts") == 300
    assert stats(cfg, "idem")["pending"] == 300
    with PawnQueue.from_config(cfg) as pq:
        keys = [o.key for o in pq.store.list("idem/messages/").objects]
    first = min(keys)  # keys sort by the created_at column
    assert first.startswith("idem/messages/20260301T000000_000000-")


def test_publish_payload_column_takes_json_text(spark: SparkSession, cfg: dict[str, Any]) -> None:
    make_topic(cfg, "pc")
    df = spark.range(5).selectExpr("to_json(named_struct('k', id, 'tag', 'x')) AS body", "id")
    assert publish_dataframe(df, "pc", cfg, payload_col="body") == 5
    got = sorted(pending_payloads(cfg, "pc"), key=lambda p: p["k"])
    assert got == [{"k": i, "tag": "x"} for i in range(5)]


# -- topic -> processing -------------------------------------------------------------------------


def test_process_topic_handles_each_message_once(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path
) -> None:
    make_topic(cfg, "work", [{"i": i} for i in range(2000)])
    out = str(tmp_path)

    def handler(msg: Any) -> None:
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        with open(os.path.join(out, f"{msg.id}.{part}.{uuid.uuid4().hex}"), "w") as f:
            f.write(json.dumps(msg.payload))

    started = datetime.now()
    result = process_topic(spark, "work", handler, cfg, partitions=4, idle_timeout_seconds=1.0)
    elapsed = (datetime.now() - started).total_seconds()
    sys.stderr.write(f"\nprocess_topic: {result} in {elapsed:.1f} s "
                     f"({2000 / elapsed:.0f} msg/s)\n")
    assert result == ProcessResult(processed=2000, failed=0, dead_lettered=0)
    seen = deliveries(tmp_path)
    assert len(seen) == 2000 and set(seen.values()) == {1}
    parts = {name.split(".")[1] for name in os.listdir(tmp_path)}
    assert len(parts) >= 2  # the work was shared between tasks
    assert stats(cfg, "work") == {"pending": 0, "leased": 0, "dead_letter": 0}


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_process_topic_retries_then_dead_letters_failures(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path, packed: bool
) -> None:
    """On a packed topic too: deliveries are counted per message in the segment leases
    across the tasks' consumers, so max_delivery_count holds per message."""
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic("flaky", packed=packed)
    make_topic(cfg, "flaky", [{"i": i} for i in range(60)])
    out = str(tmp_path)

    def handler(msg: Any) -> None:
        with open(os.path.join(out, f"{msg.id}.{uuid.uuid4().hex}"), "w") as f:
            f.write(str(msg.payload["i"]))
        if msg.payload["i"] % 10 == 0:
            raise ValueError(f"cannot handle {msg.payload['i']}")

    result = process_topic(spark, "flaky", handler, cfg, partitions=2, idle_timeout_seconds=1.0)
    # 6 failing messages x 3 deliveries (max_delivery_count): 2 retries, then dead letter
    assert result == ProcessResult(processed=54, failed=12, dead_lettered=6)
    assert sorted(deliveries(tmp_path).values()) == [1] * 54 + [3] * 6
    got = stats(cfg, "flaky")
    assert (got["pending"], got["leased"], got["dead_letter"]) == (0, 0, 6)
    assert got.get("segments", 0) == 0

    dead = spark.read.format("pawnqueue").option("topic", "flaky").option(
        "section", "dead-letter").options(**spark_options(cfg)).load()
    dead.createOrReplaceTempView("flaky_dead")
    rows = spark.sql(
        "SELECT CAST(get_json_object(payload, '$.i') AS INT) AS i, delivery_count, reason "
        "FROM flaky_dead ORDER BY i"
    ).collect()
    assert [r.i for r in rows] == [0, 10, 20, 30, 40, 50]
    assert all(r.delivery_count == 3 and "ValueError: cannot handle" in r.reason for r in rows)


def test_process_topic_tasks_register_consumers_of_their_own(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path
) -> None:
    """Task i registers ``<consumer_name>/i``: tasks running together have ids of
    their own, so the registry rank that spreads csprng_verify claims counts each."""
    make_topic(cfg, "named", [{"i": i} for i in range(200)])
    out = str(tmp_path)

    def handler(msg: Any) -> None:
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        consumer = msg._consumer
        with open(os.path.join(out, f"{msg.id}.{uuid.uuid4().hex}"), "w") as f:
            f.write(f"{part} {consumer.name} {consumer.id}")

    result = process_topic(spark, "named", handler, cfg, partitions=2, idle_timeout_seconds=1.0,
                           consumer_name="tasks")
    assert result == ProcessResult(processed=200, failed=0, dead_lettered=0)
    seen = {tuple((tmp_path / name).read_text().split()) for name in os.listdir(tmp_path)}
    assert {name for _, name, _ in seen} <= {"tasks/0", "tasks/1"}
    for part, name, cid in seen:
        assert name == f"tasks/{part}" and cid == stable_id("consumers", name)
    with PawnQueue.from_config(cfg) as pq:
        names = {e.name for e in pq.list_registrations("consumers")}
    assert names == {"tasks/0", "tasks/1"}  # both tasks registered, each its own name
    with pytest.raises(ValueError, match="consumer_name"):
        process_topic(spark, "named", handler, cfg, partitions=2, consumer_name="x" * 255)


# -- topic -> DataFrame ---------------------------------------------------------------------------


def test_consume_to_dataframe_acks_after_handover(
    spark: SparkSession, real_s3: S3Server, real_bucket: str, tmp_path: Path
) -> None:
    # Long leases: the claim phase stops at half the visibility timeout, and a loaded
    # machine must not make it stop before 100 messages are claimed.
    cfg = config_dict(real_s3, real_bucket, polling={
        **FAST_POLLING, "visibility_timeout_seconds": 300.0})
    make_topic(cfg, "c2df", [{"i": i} for i in range(120)])

    def refuse(df: Any) -> None:
        raise RuntimeError("sink unavailable")

    with pytest.raises(RuntimeError, match="sink unavailable"):
        consume_to_dataframe(spark, "c2df", cfg, max_messages=50, before_ack=refuse)
    assert stats(cfg, "c2df") == {"pending": 120, "leased": 0, "dead_letter": 0}

    df = consume_to_dataframe(spark, "c2df", cfg, max_messages=100, partitions=2,
                              before_ack=lambda d: d.write.parquet(str(tmp_path / "out")))
    assert df.columns == ["id", "topic", "producer_id", "created_at", "payload"]
    assert dict(df.dtypes)["created_at"] == "timestamp"
    rows = df.collect()
    assert len(rows) == 100 and len({r.id for r in rows}) == 100
    assert spark.read.parquet(str(tmp_path / "out")).count() == 100
    assert stats(cfg, "c2df") == {"pending": 20, "leased": 0, "dead_letter": 0}
    left = {p["i"] for p in pending_payloads(cfg, "c2df")}
    assert left.isdisjoint(json.loads(r.payload)["i"] for r in rows)


def test_consume_to_dataframe_old_idle_timeout_name_warns(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    """``idle_timeout_s`` is the deprecated name of ``idle_timeout_seconds``: it still
    works (the call returns once the topic is idle), with a DeprecationWarning."""
    make_topic(cfg, "c2df-old", [{"i": i} for i in range(3)])
    with pytest.warns(DeprecationWarning, match="'idle_timeout_seconds'"):
        df = consume_to_dataframe(spark, "c2df-old", cfg, max_messages=None,
                                  idle_timeout_s=0.5)
    assert sorted(json.loads(r.payload)["i"] for r in df.collect()) == [0, 1, 2]
    assert stats(cfg, "c2df-old") == {"pending": 0, "leased": 0, "dead_letter": 0}


# -- the data source: batch ----------------------------------------------------------------------


def test_snapshot_read_counts_schema_and_leaves_messages(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    make_topic(cfg, "snap", [{"i": i, "kind": "a" if i % 2 else "b"} for i in range(40)])
    with PawnQueue.from_config(cfg) as pq:
        consumer = pq.register_consumer("dl-maker", ["snap"])
        for msg in consumer.poll(5):
            msg.nack("bad data")
    reader = spark.read.format("pawnqueue").option("topic", "snap").options(**spark_options(cfg))
    df = reader.load()
    assert df.schema.simpleString() == (
        "struct<id:string,topic:string,producer_id:string,created_at:timestamp,"
        "payload:string,key:string,attempts:int,last_error:string>"
    )
    assert df.count() == 35
    df.createOrReplaceTempView("snap")
    by_kind = dict(spark.sql(
        "SELECT get_json_object(payload, '$.kind') AS kind, count(*) FROM snap GROUP BY kind"
    ).collect())
    assert sum(by_kind.values()) == 35
    assert stats(cfg, "snap")["pending"] == 35  # a snapshot consumes nothing

    dead = reader.option("section", "dead-letter").load()
    assert "reason" in dead.columns and "dead_lettered_at" in dead.columns
    rows = dead.collect()
    assert len(rows) == 5 and {r.reason for r in rows} == {"bad data"}
    assert all(r.original_key.startswith("snap/messages/") for r in rows)


def test_write_publishes_rows_and_counts_commit_messages(
    spark: SparkSession, cfg: dict[str, Any]
) -> None:
    make_topic(cfg, "sink")
    df = spark.range(300).selectExpr(
        "CONCAT('k', id) AS name", "id",
        "TIMESTAMP'2026-05-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) AS ts",
    ).repartition(3)
    writer = (df.write.format("pawnqueue").option("topic", "sink").options(**spark_options(cfg))
              .option("idColumn", "name").option("createdAtColumn", "ts").mode("append"))
    writer.save()
    assert stats(cfg, "sink")["pending"] == 300
    writer.save()  # deterministic ids and times: the same 300 keys again
    assert stats(cfg, "sink")["pending"] == 300
    assert sorted(p["id"] for p in pending_payloads(cfg, "sink")) == list(range(300))

    with pytest.raises(Exception, match="only appends"):
        df.write.format("pawnqueue").option("topic", "sink").options(
            **spark_options(cfg)).mode("overwrite").save()

    # The driver side of a write sums the tasks' commit messages.
    qw = QueueWriter(Settings(cfg), "sink", {}, ["id"])
    qw.commit([_Published(120), _Published(180), _Published(0)])
    assert qw.published == 300


# -- the data source: streaming -------------------------------------------------------------------


def test_stream_available_now_twice_sees_only_new_messages(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path
) -> None:
    make_topic(cfg, "events", [{"i": i} for i in range(100)])
    checkpoint = str(tmp_path / "checkpoint")
    batches: list[tuple[int, list[int]]] = []

    def collect(batch_df: Any, batch_id: int) -> None:  # runs on the driver
        batches.append((batch_id, [json.loads(r.payload)["i"] for r in batch_df.collect()]))

    def run() -> list[tuple[int, list[int]]]:
        batches.clear()
        run_available_now(spark, cfg, "events", 40, checkpoint, collect)
        return list(batches)

    first = run()
    assert [len(ids) for _, ids in first] == [40, 40, 20]
    assert sorted(i for _, ids in first for i in ids) == list(range(100))
    # Batches whose successor Spark recorded are deleted; the last batch waits for
    # the next run (commit(end) arrives one batch late).
    assert stats(cfg, "events")["pending"] == 20

    make_topic(cfg, "events", [{"i": i} for i in range(100, 150)])
    second = run()
    assert [b for b, _ in second] == [3, 4]
    assert sorted(i for _, ids in second for i in ids) == list(range(100, 150))
    assert stats(cfg, "events")["pending"] == 10

    assert run() == []  # nothing new: no batch, nothing replayed


def test_stream_reader_picks_up_stragglers_and_deletes_only_what_it_read(
    cfg: dict[str, Any]
) -> None:
    """Offsets driven by hand (no Spark): a message whose key sorts below the offset
    (published late, e.g. by a slow producer) is read by the next batch, and a commit
    deletes exactly the keys of its batch."""
    make_topic(cfg, "late", [{"i": i} for i in range(5)])
    reader = QueueStreamReader(Settings(cfg), "late", max_per_batch=100, partitions=2,
                               threads=4)
    start = reader.initialOffset()
    end1 = reader.latestOffset(start, None)
    assert len(end1["keys"]) == 5
    assert reader.latestOffset(end1, None) == end1  # nothing new
    rows = [r for p in reader.partitions(start, end1) for r in reader.read(p)]
    assert sorted(json.loads(r[4])["i"] for r in rows) == list(range(5))

    with PawnQueue.from_config(cfg) as pq:  # a straggler: its key sorts before end1's
        old = datetime.now(timezone.utc) - timedelta(hours=1)
        pq.register_producer("slow").publish("late", {"i": "late"}, created_at=old)
    make_topic(cfg, "late", [{"i": 5}])
    end2 = reader.latestOffset(end1, None)
    assert len(end2["keys"]) == 2 and min(end2["keys"]) < end1["key"]
    rows = [r for p in reader.partitions(end1, end2) for r in reader.read(p)]
    assert sorted(str(json.loads(r[4])["i"]) for r in rows) == ["5", "late"]
    assert stats(cfg, "late")["pending"] == 2  # partitions() removed batch 1 (committed)
    reader.commit(end2)
    assert stats(cfg, "late")["pending"] == 0


def publish_stragglers(cfg: dict[str, Any], topic: str, payloads: list[Any]) -> None:
    """Publish messages dated an hour ago: their keys sort below every key read so far,
    as a slow producer's do."""
    with PawnQueue.from_config(cfg) as pq:
        old = datetime.now(timezone.utc) - timedelta(hours=1)
        producer = pq.register_producer("slow")
        for payload in payloads:
            producer.publish(topic, payload, created_at=old)


def test_stream_reader_deletes_a_straggler_batch_as_big_as_the_one_before(
    cfg: dict[str, Any]
) -> None:
    """Offsets driven by hand, in Spark's order (the next batch is planned, then the
    previous one committed): a batch of stragglers below the high mark, as many as the
    batch before it, ends at the same high mark. It is still deleted when committed,
    and never comes back."""
    make_topic(cfg, "lag", [{"i": 0}, {"i": 1}])
    reader = QueueStreamReader(Settings(cfg), "lag", max_per_batch=2, partitions=1,
                               threads=2)
    start = reader.initialOffset()
    end1 = reader.latestOffset(start, None)
    reader.partitions(start, end1)
    publish_stragglers(cfg, "lag", [{"i": "s0"}, {"i": "s1"}])
    end2 = reader.latestOffset(end1, None)
    # the premise: the same high mark and the same count, other keys
    assert end2["key"] == end1["key"] and len(end2["keys"]) == len(end1["keys"]) == 2
    assert set(end2["keys"]).isdisjoint(end1["keys"])
    reader.commit(end1)
    reader.partitions(end1, end2)
    make_topic(cfg, "lag", [{"i": 2}])
    end3 = reader.latestOffset(end2, None)
    assert len(end3["keys"]) == 1
    reader.commit(end2)  # the stragglers' batch is done: deleted
    assert stats(cfg, "lag")["pending"] == 1
    reader.partitions(end2, end3)
    assert reader.latestOffset(end3, None) == end3  # nothing comes back


def test_stream_straggler_batch_is_not_redelivered(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path
) -> None:
    """A real availableNow stream, two messages a batch. The second run's first batch
    is two stragglers below the first run's high mark (so the same high mark and count
    as the batch before); they are deleted once the next batch is planned and never
    delivered again."""
    make_topic(cfg, "strag", [{"i": "m0"}, {"i": "m1"}])
    checkpoint = str(tmp_path / "checkpoint")
    batches: list[list[str]] = []

    def collect(batch_df: Any, batch_id: int) -> None:  # runs on the driver
        batches.append(sorted(json.loads(r.payload)["i"] for r in batch_df.collect()))

    def run() -> list[list[str]]:
        batches.clear()
        run_available_now(spark, cfg, "strag", 2, checkpoint, collect)
        return list(batches)

    assert run() == [["m0", "m1"]]
    publish_stragglers(cfg, "strag", [{"i": "s0"}, {"i": "s1"}])
    make_topic(cfg, "strag", [{"i": "n0"}, {"i": "n1"}])
    assert run() == [["s0", "s1"], ["n0", "n1"]]
    assert sorted(p["i"] for p in pending_payloads(cfg, "strag")) == ["n0", "n1"]
    assert run() == []


# -- secrets ------------------------------------------------------------------------------------


def test_credentials_never_appear_in_plans_or_reprs(
    spark: SparkSession,
    real_s3: S3Server,
    real_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # SeaweedFS checks signatures: the leak-check identity is valid and easy to search for.
    key_id, secret = LEAK_CHECK_ACCESS_KEY, LEAK_CHECK_SECRET_KEY
    cfg = config_dict(real_s3, real_bucket, polling=FAST_POLLING,
                      s3={"aws_access_key_id": key_id, "aws_secret_access_key": secret})
    make_topic(cfg, "sec", [{"i": 1}])
    opts = spark_options(cfg)
    assert opts["accessKey"] == key_id and opts["secretKey"] == secret

    shown = io.StringIO()
    df = spark.read.format("pawnqueue").option("topic", "sec").options(**opts).load()
    df.explain(True)
    assert df.count() == 1
    stream = spark.readStream.format("pawnqueue").option("topic", "sec").options(**opts).load()
    stream.explain(True)
    query = stream.writeStream.format("noop").trigger(availableNow=True).option(
        "checkpointLocation", str(tmp_path / "checkpoint")).start()
    query.awaitTermination()
    query.explain(True)
    shown.write(capsys.readouterr().out)
    shown.write(str(query.lastProgress) + str(query.recentProgress) + str(query.status))
    source = PawnQueueDataSource({"topic": "sec", **opts})
    for obj in (source, source.reader(source.schema()), Settings(cfg),
                source.streamReader(source.schema()),
                QueueWriter(Settings(cfg), "sec", {}, ["x"])):
        shown.write(repr(obj) + str(obj))
    text = shown.getvalue()
    assert "pawnqueue" in text and real_bucket in text  # we did capture the plans
    assert secret not in text
    assert key_id not in text

    for name in ("aws_access_key_id", "aws_secret_access_key"):
        with pytest.raises(ConfigError, match="instead"):
            PawnQueueDataSource({"topic": "sec", name: "x"}).reader(source.schema())
    with pytest.raises(ConfigError, match="did you mean 'numPartitions'") as err:
        PawnQueueDataSource({"topic": "sec", "numPartition": secret}).reader(source.schema())
    assert secret not in str(err.value)


# -- one client per process ----------------------------------------------------------------


def test_per_process_builds_once_per_settings_and_anew_in_a_forked_child(
    tmp_path: Path,
) -> None:
    """What queue_for and store_for keep: one object per (process, settings), reused;
    a forked child (a Python worker forked by Spark's daemon) builds its own."""
    built: list[tuple[int, str]] = []

    def build(settings: Settings) -> object:
        built.append((os.getpid(), settings.describe()))
        return object()

    cache: PerProcess[object] = PerProcess(build)
    one = Settings({"local": {"path": str(tmp_path / "one")}})
    two = Settings({"local": {"path": str(tmp_path / "two")}})
    first = cache.get(one)
    assert cache.get(one) is first and cache.get(two) is not first
    assert len(built) == 2
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new object, built here
        fresh = cache.get(one)
        os.write(write, b"1" if fresh is not first and built[-1][0] == os.getpid() else b"0")
        os._exit(0)
    os.close(write)
    assert os.waitpid(pid, 0)[1] == 0
    assert os.read(read, 1) == b"1"
    assert cache.get(one) is first and len(built) == 2  # the parent's is untouched


# -- worker reuse -------------------------------------------------------------------------------


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no-reuse"])
def test_publish_and_process_with_and_without_worker_reuse(
    spark: SparkSession, cfg: dict[str, Any], tmp_path: Path, reuse: bool
) -> None:
    """Without reuse every task runs in a fresh process that exits when the task ends:
    nothing may still be running then (every write lands, every ack is flushed)."""
    make_topic(cfg, "reuse")
    out = str(tmp_path)

    def handler(msg: Any) -> None:
        with open(os.path.join(out, f"{msg.id}.{os.getpid()}"), "w") as f:
            f.write("x")

    with worker_reuse(spark, reuse):
        first, second = task_pids(spark), task_pids(spark)
        if reuse:
            assert first & second  # the premise: workers are kept...
        else:
            assert not first & second  # ...or really not
        df = spark.range(200).selectExpr("id AS n").repartition(4)
        assert publish_dataframe(df, "reuse", cfg, batch_size=50, threads=8) == 200
        assert stats(cfg, "reuse")["pending"] == 200
        result = process_topic(spark, "reuse", handler, cfg, partitions=2, idle_timeout_seconds=0.5)
    assert result == ProcessResult(200, 0, 0)
    assert sorted(deliveries(tmp_path).values()) == [1] * 200
    assert stats(cfg, "reuse") == {"pending": 0, "leased": 0, "dead_letter": 0}


# -- the example ----------------------------------------------------------------------------------


def test_example_pipeline(spark: SparkSession, cfg: dict[str, Any], tmp_path: Path) -> None:
    """examples/orders_pipeline.py end to end: 100 orders, every 25th invalid."""
    import importlib.util

    from pyspark import cloudpickle

    path = Path(__file__).resolve().parent.parent / "examples" / "orders_pipeline.py"
    spec = importlib.util.spec_from_file_location("orders_pipeline_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)  # executors cannot import it
        result = module.run_pipeline(spark, cfg, str(tmp_path), n_orders=100)
    finally:
        sys.modules.pop(spec.name, None)
    assert result["published"] == 100
    assert result["checked"] == ProcessResult(processed=96, failed=8, dead_lettered=4)
    revenue = result["revenue"].collect()
    assert len(revenue) == 7 and sum(r.orders for r in revenue) == 96
    rejected = result["rejected"].collect()
    assert [r.order_id for r in rejected] == [f"order-{i:05d}" for i in (24, 49, 74, 99)]
    assert all(r.amount == -1.0 and r.delivery_count == 3 for r in rejected)
    assert stats(cfg, "orders") == {"pending": 0, "leased": 0, "dead_letter": 4}
    # The output belongs to that store: a run on another store must not reuse it (it
    # once read nothing through the old checkpoint and showed the old tables).
    other = {"local": {"path": str(tmp_path / "other-store")}}
    with PawnQueue.from_config(other) as elsewhere, pytest.raises(ValueError, match="another"):
        module.claim_output(str(tmp_path), elsewhere.store.describe())
