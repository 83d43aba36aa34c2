"""A worker pool through a store outage (found by the chaos suite's scenario 3, issue 15).

The pool runs on SeaweedFS behind :class:`tests.fault_proxy.FaultProxy`; the outage is
the proxy answering every request 503 SlowDown until it is disarmed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.workers import RET_OK, WorkerPool
from tests.fault_proxy import FaultProxy, FaultRule
from tests.runtime_handlers import read_records
from tests.servers import S3Server, config_dict

TOPIC = "jobs"
#: No wait here is longer than this: fail, never hang.
DEADLINE = 90.0



def start_recording_pool(
    cfg: dict, topic: str
) -> tuple[WorkerPool, list[int], threading.Thread]:
    """A one-process, one-thread pool of ``tests.runtime_handlers:record`` on ``topic``
    with a short restart back-off and ``max_start_failures=3``, run on a thread: the
    pool, the list its exit status is appended to, and that thread."""
    pool = WorkerPool(cfg, [topic], "tests.runtime_handlers:record", processes=1,
                      threads=1, restart_backoff_seconds=0.05,
                      restart_backoff_max_seconds=0.2, max_start_failures=3)
    statuses: list[int] = []
    runner = threading.Thread(target=lambda: statuses.append(pool.run()), daemon=True)
    runner.start()
    return pool, statuses, runner

def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def handled(record_dir: Path) -> set[str]:
    return {mid for events in read_records(str(record_dir)).values()
            for event, mid in events if event == "done"}


def test_a_child_restarted_during_a_store_outage_waits_it_out(
    real_s3: S3Server, real_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that dies while the store is down is restarted; its replacements cannot
    reach the store until it is back. Those start failures counted toward
    ``max_start_failures``, so a store outage longer than a few restarts made the pool
    give up (RET_START_FAILED) and stop its healthy children: a SeaweedFS restart took
    the whole pool down. Now a child that cannot reach the store the supervisor reached
    is restarted with the back-off until the store is back."""
    monkeypatch.setenv("PAWNQ_TEST_RECORD_DIR", str(tmp_path))
    direct = config_dict(real_s3, real_bucket)
    with FaultProxy(real_s3.endpoint_url) as proxy, PawnQueue.from_config(direct) as pq:
        pq.create_topic(TOPIC)
        producer = pq.register_producer("producer")
        cfg = config_dict(real_s3, real_bucket, s3={
            "endpoint_url": proxy.endpoint_url, "connect_timeout_seconds": 1.0,
            "read_timeout_seconds": 2.0,
        }, polling={"interval_seconds": 0.2})
        pool, statuses, runner = start_recording_pool(cfg, TOPIC)
        try:
            first = producer.publish(TOPIC, {"n": 0})
            wait_for(lambda: first in handled(tmp_path), "the first message handled")
            proxy.set_rules([FaultRule("slowdown_503", 1.0)])
            proxy.arm()  # the store is down
            [pid] = pool.worker_pids().values()
            os.kill(pid, signal.SIGKILL)
            # the kill's restart, then three replacements that could not reach the store
            # (max_start_failures of them: the pool gave up there)
            wait_for(lambda: pool.restarts >= 4 or not runner.is_alive(),
                     "three failed starts during the outage")
            assert runner.is_alive(), f"the pool gave up during the outage: {statuses}"
            proxy.disarm()  # the store is back
            second = producer.publish(TOPIC, {"n": 1})
            wait_for(lambda: second in handled(tmp_path) or not runner.is_alive(),
                     "a message handled after the outage")
            assert runner.is_alive(), f"the pool gave up after the outage: {statuses}"
        finally:
            pool.stop()
            runner.join(DEADLINE)
    assert statuses == [RET_OK]
    assert any(f.kind == "slowdown_503" for f in proxy.fault_log())
