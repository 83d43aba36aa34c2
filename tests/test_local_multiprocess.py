"""The embedded local store shared by several processes on one machine.

Three ``spawn``-ed processes (no state inherited from the parent) open the same
directory through the public API. They start together behind a barrier, so their
requests really interleave. Consumers: every one of 300 messages is delivered exactly
once overall. Producers: 3 x 100 concurrent publishes, nothing lost.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pawn_queue_sync import PawnQueue

PROCESSES = 3
MESSAGES = 300
TOPIC = "jobs"
#: A process still working after this long is stuck: the test fails, never hangs.
DEADLINE_SECONDS = 90.0


def local_config(path: Path) -> dict[str, Any]:
    return {
        "local": {"path": str(path)},
        "polling": {"max_messages_per_poll": 10},
    }


def _consume_worker(config: dict[str, Any], barrier: Any, results: Any, index: int) -> None:
    """Consume until the topic is empty; report every delivered id (dups included)."""
    delivered: list[str] = []
    error = ""
    try:
        with PawnQueue.from_config(config) as pq:
            consumer = pq.register_consumer(f"worker-{index}", topics=[TOPIC])
            barrier.wait(timeout=60)
            deadline = time.monotonic() + DEADLINE_SECONDS
            while time.monotonic() < deadline:
                batch = consumer.poll()
                for msg in batch:
                    delivered.append(msg.id)
                    msg.ack()
                # An empty poll can mean "the rest is leased by the others": stop only
                # once nothing is pending at all (the others ack what they hold).
                if not batch and pq.topic_stats(TOPIC)["pending"] == 0:
                    break
            else:
                error = "deadline passed with messages pending"
    except BaseException as exc:  # report it: an exception in a child is otherwise lost
        error = f"{type(exc).__name__}: {exc}"
    results.put((index, delivered, error))


def _publish_worker(config: dict[str, Any], barrier: Any, results: Any, index: int) -> None:
    """Publish 100 messages one by one; report their ids."""
    ids: list[str] = []
    error = ""
    try:
        with PawnQueue.from_config(config) as pq:
            producer = pq.register_producer("shared-producer")
            barrier.wait(timeout=60)
            for n in range(MESSAGES // PROCESSES):
                ids.append(producer.publish(TOPIC, {"process": index, "n": n}))
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    results.put((index, ids, error))


def _run(target: Any, config: dict[str, Any]) -> dict[int, list[str]]:
    """Run ``target`` in PROCESSES spawned processes; their reports by index."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(config, barrier, results, i), daemon=True)
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=DEADLINE_SECONDS + 60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    errors = {i: err for i, _, err in reports if err}
    assert errors == {}
    return {i: ids for i, ids, _ in reports}


def test_three_processes_consume_each_message_exactly_once(tmp_path: Path) -> None:
    config = local_config(tmp_path / "store")
    with PawnQueue.from_config(config) as pq:
        pq.create_topic(TOPIC)
        published = pq.register_producer("feeder").publish_batch(
            TOPIC, [{"n": n} for n in range(MESSAGES)]
        )
    assert len(set(published)) == MESSAGES

    by_process = _run(_consume_worker, config)

    counts = Counter(mid for ids in by_process.values() for mid in ids)
    duplicates = {mid: n for mid, n in counts.items() if n > 1}
    assert duplicates == {}
    assert set(counts) == set(published)
    assert sum(counts.values()) == MESSAGES
    # every process really took part (they started together behind a barrier)
    assert all(by_process[i] for i in range(PROCESSES)), {
        i: len(ids) for i, ids in by_process.items()
    }
    with PawnQueue.from_config(config) as pq:
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}


def test_three_processes_publish_concurrently_and_nothing_is_lost(tmp_path: Path) -> None:
    config = local_config(tmp_path / "store")
    with PawnQueue.from_config(config) as pq:
        pq.create_topic(TOPIC)

    by_process = _run(_publish_worker, config)

    published = [mid for ids in by_process.values() for mid in ids]
    assert len(published) == MESSAGES
    assert len(set(published)) == MESSAGES

    with PawnQueue.from_config(config) as pq:
        assert pq.topic_stats(TOPIC)["pending"] == MESSAGES
        # one registration for the shared producer name, whichever process won
        producers = pq.list_registrations("producers")
        assert [e.name for e in producers] == ["shared-producer"]
        consumer = pq.register_consumer("checker", topics=[TOPIC])
        seen: list[tuple[str, dict[str, Any], str | None]] = []
        while batch := consumer.poll(100):
            for msg in batch:
                seen.append((msg.id, msg.payload, msg.producer_id))
                msg.ack()
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}

    assert sorted(mid for mid, _, _ in seen) == sorted(published)
    assert {pid for _, _, pid in seen} == {producers[0].entity_id}
    # payloads intact, and each process's messages kept its publish order
    for i, ids in by_process.items():
        order = [payload["n"] for mid, payload, _ in seen if payload["process"] == i]
        assert order == list(range(MESSAGES // PROCESSES))
        assert [mid for mid, payload, _ in seen if payload["process"] == i] == ids
