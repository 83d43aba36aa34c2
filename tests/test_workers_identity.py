"""WorkerPool children have identities of their own: ``<consumer_name>/<index>``.

Each child registers its own consumer, so the registry rank that spreads csprng_verify
claims sees every child, and a child restarted at an index registers the same name,
so the same id. Children are spawn-started, on SeaweedFS; they record what they are in
files (one per process) through :func:`record_identity`, imported by name.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.queue.registry import stable_id
from pawn_queue_sync.workers import RET_OK, WorkerPool, child_consumer_name
from tests.servers import S3Server, config_dict

TOPIC = "jobs"
HANDLER = "tests.test_workers_identity:record_identity"
DEADLINE = 90.0
POLLING = {"interval_seconds": 0.3, "visibility_timeout_seconds": 5, "jitter_max_ms": 20,
           "lease_refresh_interval_seconds": 1}


def record_identity(msg: Any) -> None:
    """The handler the children run: append ``pid name id rank peers`` to
    ``$PAWNQ_TEST_IDENTITY_DIR/<pid>.log`` (one O_APPEND write per line)."""
    consumer = msg._consumer
    place, peers = consumer._registered_peers()
    line = f"{os.getpid()} {consumer.name} {consumer.id} {place} {peers}\n"
    path = os.path.join(os.environ["PAWNQ_TEST_IDENTITY_DIR"], f"{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    time.sleep(0.02)  # a little work, so one child cannot take everything


def read_identities(directory: Path) -> list[tuple[int, str, str, int, int]]:
    out = []
    for path in directory.glob("*.log"):
        for line in path.read_text().splitlines():
            pid, name, cid, place, peers = line.split()
            out.append((int(pid), name, cid, int(place), int(peers)))
    return out


@pytest.fixture
def identity_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "identities"
    path.mkdir()
    monkeypatch.setenv("PAWNQ_TEST_IDENTITY_DIR", str(path))  # inherited by the children
    return path


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def queue(real_s3: S3Server, real_bucket: str) -> Iterator[tuple[dict[str, Any], PawnQueue]]:
    # heartbeats and rank refreshed every second: a child that asked before its sibling
    # registered sees it a second later
    cfg = config_dict(real_s3, real_bucket, polling=POLLING,
                      registry={"heartbeat_interval_seconds": 1.0})
    pq = PawnQueue(load_config(cfg)).setup()
    pq.create_topic(TOPIC)
    try:
        yield cfg, pq
    finally:
        pq.close()


def test_pool_children_register_their_own_names_and_a_restart_reuses_its_id(
    queue: tuple[dict[str, Any], PawnQueue], identity_dir: Path
) -> None:
    cfg, pq = queue
    producer = pq.register_producer("producer")
    pool = WorkerPool(cfg, [TOPIC], HANDLER, processes=2, threads=2, consumer_name="pool",
                      restart_backoff_seconds=0.2)
    statuses: list[int] = []
    runner = threading.Thread(target=lambda: statuses.append(pool.run()), daemon=True)
    runner.start()
    try:
        expected = {"pool/0", "pool/1"}

        def both_ranked() -> bool:
            """Publish a little more until each child has handled a message knowing
            both (two peers); fail at once on a name that is not a child's own."""
            records = read_identities(identity_dir)
            names = {name for _, name, *_ in records}
            assert names <= expected, names  # before: every child registered "pool"
            seen = {(name, place) for _, name, _, place, peers in records if peers == 2}
            if {name for name, _ in seen} == expected:
                return True
            producer.publish_batch(TOPIC, [{"n": i} for i in range(8)])
            return False

        wait_for(both_ranked, "both children to handle messages knowing each other")
        records = read_identities(identity_dir)
        pids = pool.worker_pids()
        for pid, name, cid, _place, _peers in records:
            index = next(i for i, p in pids.items() if p == pid)
            assert name == child_consumer_name("pool", index)
            assert cid == stable_id("consumers", name)
        # different ranks, so different starting shares of the id space
        ranks = {name: place for _, name, _, place, peers in records if peers == 2}
        assert sorted(ranks.values()) == [0, 1]

        old_pid = pids[0]
        os.kill(old_pid, signal.SIGKILL)
        wait_for(lambda: pool.worker_pids().get(0, old_pid) != old_pid, "worker 0 restart")
        new_pid = pool.worker_pids()[0]

        def restarted_worked() -> bool:
            if any(pid == new_pid for pid, *_ in read_identities(identity_dir)):
                return True
            producer.publish_batch(TOPIC, [{"n": i} for i in range(8)])
            return False

        wait_for(restarted_worked, "the restarted worker to handle a message")
        mine = {(name, cid) for pid, name, cid, *_ in read_identities(identity_dir)
                if pid == new_pid}
        assert mine == {("pool/0", stable_id("consumers", "pool/0"))}
        # no third registration: the restart reused worker 0's entry
        assert {e.name for e in pq.list_registrations("consumers")} == expected
    finally:
        pool.stop()
        runner.join(DEADLINE)
    assert not runner.is_alive()
    assert statuses == [RET_OK]


def test_child_names_are_checked_before_any_child_starts() -> None:
    assert child_consumer_name("worker", 3) == "worker/3"
    assert WorkerPool(None, [TOPIC], HANDLER, processes=2, consumer_name="w" * 254)
    with pytest.raises(ValueError, match="consumer_name"):
        WorkerPool(None, [TOPIC], HANDLER, processes=2, consumer_name="w" * 255)
    with pytest.raises(ValueError, match="consumer_name"):
        WorkerPool(None, [TOPIC], HANDLER, consumer_name="")
