"""Regressions of pawn_queue_sync.spark, on SeaweedFS with the session's local Spark
session (the ``spark`` fixture of tests/conftest.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.protocol.lease import STALE_GRACE_SECONDS
from pawn_queue_sync.spark import consume_to_dataframe
from tests.servers import S3Server, config_dict
from tests.test_spark import FAST_POLLING, make_topic, stats

#: One JVM serves every Spark test: under pytest-xdist they run in one worker.
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-2")]


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_consume_to_dataframe_keeps_leases_while_before_ack_runs(
    spark: SparkSession, real_s3: S3Server, real_bucket: str, packed: bool
) -> None:
    """The executors claim under leases and the driver acks after ``before_ack``:
    nothing renewed the leases in between, so a ``before_ack`` longer than the
    visibility timeout let another consumer take the messages (and the driver's ack
    then failed, the messages delivered twice). The driver now renews them (on a packed
    topic: the segment leases it claimed itself)."""
    visibility = 3.0
    cfg = config_dict(real_s3, real_bucket, polling={
        **FAST_POLLING, "visibility_timeout_seconds": visibility,
        "lease_refresh_interval_seconds": 0.5}, publishing={"max_segment_messages": 10})
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic("slow-sink", packed=packed)
    make_topic(cfg, "slow-sink", [{"i": i} for i in range(30)])
    stolen: list[str] = []
    seen_rows: list[int] = []

    def slow_sink(df: Any) -> None:
        seen_rows.append(df.count())
        # Another consumer polls while the sink works, until every lease claimed before
        # the sink started would be stale by the server's clock had nothing renewed it
        # (a second of slack for its one-second timestamps), then once more.
        with PawnQueue.from_config(cfg) as pq:
            other = pq.register_consumer("other", ["slow-sink"])
            started = pq.store.server_time()
            assert started is not None
            stale_after = visibility + STALE_GRACE_SECONDS + 1.0
            while True:
                got = other.poll(30)
                stolen.extend(m.id for m in got)  # never acked: the driver's to settle
                now = pq.store.server_time()
                assert now is not None
                if (now - started).total_seconds() > stale_after:
                    break
                time.sleep(0.2)
            stolen.extend(m.id for m in other.poll(30))

    df = consume_to_dataframe(spark, "slow-sink", cfg, max_messages=30, partitions=2,
                              idle_timeout_seconds=0.5, before_ack=slow_sink)
    assert seen_rows == [30]
    assert stolen == []
    assert len({r.id for r in df.collect()}) == 30
    got = stats(cfg, "slow-sink")
    assert (got["pending"], got["leased"], got["dead_letter"]) == (0, 0, 0)
    assert got.get("segments", 0) == 0 and got.get("segments_leased", 0) == 0
