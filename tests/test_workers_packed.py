"""The WorkerPool on a packed topic (issue 14), on SeaweedFS: two spawn-started worker
processes share the topic's segments and handle every message exactly once. Handlers
record each delivery (message id and pid) in a file per process, through
:func:`record_delivery`, imported by name.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.workers import RET_OK, WorkerPool
from tests.servers import S3Server, config_dict

TOPIC = "packed-jobs"
HANDLER = "tests.test_workers_packed:record_delivery"
DEADLINE = 120.0
MESSAGES = 600


def record_delivery(msg: Any) -> None:
    """The children's handler: append ``pid message_id`` to
    ``$PAWNQ_TEST_DELIVERY_DIR/<pid>.log`` (one O_APPEND write per line)."""
    path = os.path.join(os.environ["PAWNQ_TEST_DELIVERY_DIR"], f"{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {msg.id}\n".encode())
    finally:
        os.close(fd)
    time.sleep(0.01)  # a little work, so one child cannot take everything at once


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_pool_of_two_processes_consumes_a_packed_topic_once(
    real_s3: S3Server, real_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "deliveries"
    out.mkdir()
    monkeypatch.setenv("PAWNQ_TEST_DELIVERY_DIR", str(out))  # inherited by the children
    cfg = config_dict(real_s3, real_bucket, publishing={"max_segment_messages": 20},
                      polling={"interval_seconds": 0.2, "visibility_timeout_seconds": 30,
                               "jitter_max_ms": 20})
    with PawnQueue(load_config(cfg)) as pq:
        pq.create_topic(TOPIC, packed=True)
        ids = pq.register_producer("producer").publish_batch(
            TOPIC, [{"n": i} for i in range(MESSAGES)])
        assert pq.topic_stats(TOPIC)["segments"] == MESSAGES // 20

        pool = WorkerPool(cfg, [TOPIC], HANDLER, processes=2, threads=4, consumer_name="pool")
        statuses: list[int] = []
        runner = threading.Thread(target=lambda: statuses.append(pool.run()), daemon=True)
        runner.start()
        try:
            wait_for(lambda: pq.topic_stats(TOPIC)["segments"] == 0, "every segment done")
        finally:
            pool.stop()
            runner.join(DEADLINE)
        assert not runner.is_alive()
        assert statuses == [RET_OK]
        final = pq.topic_stats(TOPIC)
    assert final["pending"] == 0 and final["segments_leased"] == 0
    assert final["dead_letter"] == 0
    records = [line.split() for p in out.glob("*.log") for line in p.read_text().splitlines()]
    delivered = Counter(mid for _, mid in records)
    assert sorted(delivered) == sorted(ids)
    assert set(delivered.values()) == {1}  # every message once: no duplicate delivery
    assert len({pid for pid, _ in records}) == 2  # both processes took segments
