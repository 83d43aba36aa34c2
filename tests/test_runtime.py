"""The consumer runtime: lease refresh, Listener, drain, WorkerPool, ``pawnq worker``.

Most tests run on the in-memory store with a virtual clock of its own
(``pawn_queue_sync.testing.memory_queue``: a ``FakeClock(auto=True)``, so leases,
backoffs and timeouts pass in virtual seconds); the listener under load, a stop under
load, an idle listener's request count, and the worker processes run against a real
SeaweedFS (``real_s3``; each test on a fresh bucket) as integration tests. Every
delivery is counted per message id; ordering is arranged with events, never with
sleeps (a sleep inside a handler, on the clock, only simulates slow work). Worker
processes record deliveries in files (tests/runtime_handlers.py).

Timing facts used below: a lease is stale when the server's clock is more than
``visibility_timeout + 1 s`` (the grace for the 1-second resolution of LastModified)
past its last write; tests use a 3 s visibility timeout and refresh every 1 s.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pawn_queue_sync import Message, PawnQueue, layout, load_config, testing
from pawn_queue_sync.cli import main as pawnq_main
from pawn_queue_sync.cli.worker import main as worker_main
from pawn_queue_sync.errors import StorageError
from pawn_queue_sync.runtime import DrainResult, LeaseRefresher, Listener, drain
from pawn_queue_sync.runtime import poller as poller_module
from pawn_queue_sync.workers import (
    RET_CONFIG,
    RET_CONNECT,
    RET_IMPORT,
    RET_KILLED,
    RET_OK,
    WorkerPool,
)
from tests import runtime_handlers
from tests.servers import S3Server, config_dict
from tests.short_leases import POLLING, reap
from tests.threads import join, run_in_thread

REPO = Path(__file__).resolve().parent.parent
TOPIC = "jobs"
#: No test waits longer than this for anything: fail, never hang.
DEADLINE = 90.0
#: Threads of a started PawnQueue itself (live until it is closed).
QUEUE_POOLS = ("pawnq-claim", "pawnq-publish")


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def cfg(real_s3: S3Server, real_bucket: str) -> dict[str, Any]:
    """Configuration for a fresh bucket on SeaweedFS with short leases."""
    return config_dict(real_s3, real_bucket, polling=POLLING)


def open_queue(cfg: dict[str, Any]) -> PawnQueue:
    """A started queue with TOPIC created (a queue per consumer = a client per consumer)."""
    pq = PawnQueue(load_config(cfg)).setup()
    pq.create_topic(TOPIC)
    return pq


def memory_queue(hooks: Callable[[str, str], None] | None = None,
                 **polling: Any) -> PawnQueue:
    """A started queue with TOPIC on the memory store and a virtual clock of its own
    (``FakeClock(auto=True)``: leases, backoffs and idle timeouts in virtual time)."""
    return testing.memory_queue({"polling": {**POLLING, **polling}}, topics=[TOPIC],
                                hooks=hooks)


def same_store(pq: PawnQueue) -> PawnQueue:
    """A second queue (as another process would be) on ``pq``'s memory store and clock."""
    return PawnQueue(pq.config, store=pq.store, clock=pq.context.clock).setup()


def publish(pq: PawnQueue, n: int) -> list[str]:
    return pq.register_producer("producer").publish_batch(TOPIC, [{"n": i} for i in range(n)])


def run_until(listener: Listener, reached: threading.Event) -> None:
    """Run *listener* on a thread until *reached* is set, then stop it and wait for
    ``run()`` to return."""
    runner = run_in_thread(listener.run)
    assert reached.wait(DEADLINE)
    listener.stop()
    join(runner)


def runtime_threads() -> list[str]:
    """Names of runtime threads alive (listener, refresher, handlers, settler, poll)."""
    return [
        t.name for t in threading.enumerate()
        if t.name.startswith("pawnq-") and not t.name.startswith(QUEUE_POOLS)
    ]


#: threads alive when the running test started (another test's leftovers in the same
#: xdist worker are not this test's: a queue a test did not close keeps its pool's
#: threads until it is collected)
_BEFORE: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _threads_before() -> None:
    _BEFORE.clear()
    _BEFORE.update(threading.enumerate())


def all_pawnq_threads() -> list[str]:
    """Our threads started during this test and still alive."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("pawnq-") and t not in _BEFORE]


class Recorder:
    """Counts deliveries per message id, thread-safely; ``reached`` fires at ``target``
    distinct messages."""

    def __init__(self, target: int | None = None) -> None:
        self.lock = threading.Lock()
        self.deliveries: Counter[str] = Counter()
        self.handled: list[str] = []
        self.target = target
        self.reached = threading.Event()

    def start(self, msg: Message) -> None:
        with self.lock:
            self.deliveries[msg.id] += 1

    def done(self, msg: Message) -> None:
        with self.lock:
            self.handled.append(msg.id)
            if self.target is not None and len(set(self.handled)) >= self.target:
                self.reached.set()


# -- Listener on SeaweedFS ----------------------------------------------------------------


def test_listen_8_threads_500_messages_each_processed_exactly_once(cfg: dict[str, Any]) -> None:
    pq = open_queue(cfg)
    try:
        ids = publish(pq, 500)
        consumer = pq.register_consumer("billing", [TOPIC])
        rec = Recorder(target=500)

        def handler(msg: Message) -> None:
            rec.start(msg)
            rec.done(msg)

        stop = threading.Event()
        started = time.monotonic()
        runner = run_in_thread(lambda: consumer.listen(handler, max_workers=8, stop_event=stop))
        assert rec.reached.wait(DEADLINE), f"only {len(rec.deliveries)} of 500 handled"
        elapsed = time.monotonic() - started
        stop.set()
        join(runner)
        assert set(rec.deliveries) == set(ids)
        assert [mid for mid, n in rec.deliveries.items() if n != 1] == []
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
        assert runtime_threads() == []
        logging.getLogger(__name__).info("500 messages in %.2f s", elapsed)
    finally:
        pq.close()
    assert all_pawnq_threads() == []


def test_handler_failing_twice_then_succeeding_is_retried_and_acked() -> None:
    pq = memory_queue()
    try:
        publish(pq, 1)
        seen: list[tuple[int, str]] = []
        succeeded = threading.Event()

        def handler(msg: Message) -> None:
            seen.append((msg.delivery_count, msg.body.get("last_error", "")))
            if msg.delivery_count < 3:
                raise RuntimeError(f"transient failure #{msg.delivery_count}")
            succeeded.set()

        listener = Listener(pq.register_consumer("c", [TOPIC]), handler, max_workers=2,
                            retry_backoff_seconds=0.2)
        run_until(listener, succeeded)
        assert [n for n, _ in seen] == [1, 2, 3]
        assert seen[1][1].startswith("RuntimeError: transient failure #1")
        assert seen[2][1].startswith("RuntimeError: transient failure #2")
        assert (listener.stats.processed, listener.stats.failed,
                listener.stats.dead_lettered) == (1, 2, 0)
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    finally:
        pq.close()


def test_always_failing_handler_is_dead_lettered_with_the_error() -> None:
    pq = memory_queue()
    try:
        [mid] = publish(pq, 1)
        counts: list[int] = []

        def handler(msg: Message) -> None:
            counts.append(msg.delivery_count)
            raise ValueError(f"cannot handle payload {msg.payload}")

        result = drain(pq.register_consumer("c", [TOPIC]), handler, idle_timeout_seconds=0.5,
                       threads=2, max_messages=10)  # bounded, should retries never end
        assert result == DrainResult(processed=0, failed=2, dead_lettered=1)
        assert counts == [1, 2, 3]  # max_delivery_count = 3
        assert runtime_threads() == []
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 1}
        doc = json.loads(pq.store.get(layout.dead_letter_key(TOPIC, mid)).body)
        reason = doc["dead_letter"]["reason"]
        assert reason.startswith("ValueError: cannot handle payload {'n': 0}")
        assert "in handler" in reason  # a short traceback names the failing frame
        assert doc["dead_letter"]["delivery_count"] == 3
        assert doc["attempts"] == 2
        assert doc["payload"] == {"n": 0}
    finally:
        pq.close()


def test_handler_slower_than_visibility_keeps_its_lease_and_is_not_redelivered() -> None:
    """The handler runs 6.5 s (virtual), past the 4 s after which an unrefreshed lease
    is stale; a second consumer (its own queue on the same store) polls every 0.5 s all
    along and must get nothing."""
    pq_a = memory_queue()
    pq_b = same_store(pq_a)
    clock = pq_a.context.clock
    try:
        publish(pq_a, 1)
        started, finished = threading.Event(), threading.Event()
        states: list[str] = []

        def slow(msg: Message) -> None:
            started.set()
            clock.sleep(6.5)  # simulated slow work
            states.append(msg.state)
            finished.set()

        listener = Listener(pq_a.register_consumer("a", [TOPIC]), slow, max_workers=1)
        runner = run_in_thread(listener.run)
        assert started.wait(DEADLINE)
        rival = pq_b.register_consumer("b", [TOPIC])
        stolen: list[Message] = []
        deadline = time.monotonic() + DEADLINE
        while not finished.is_set():
            assert time.monotonic() < deadline, "the slow handler never finished"
            clock.sleep(0.5)
            stolen += rival.poll()
        listener.stop()
        join(runner)
        assert stolen == []
        assert states == ["leased"]  # never lost
        assert listener.refresher.refreshes >= 4
        assert (listener.stats.processed, listener.stats.lost) == (1, 0)
        assert pq_a.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    finally:
        pq_a.close()
        pq_b.close()


def test_stop_during_load_loses_nothing(
    real_s3: S3Server, real_bucket: str
) -> None:
    """A stops while busy; B (own client) takes the rest at once. Long leases (30 s) make
    a lease A left behind visible (B would go idle before it expired), and acks are only
    flushed at stop here (long flush interval), so the flush-on-stop is exercised."""
    cfg = config_dict(real_s3, real_bucket, polling={
        **POLLING, "visibility_timeout_seconds": 30, "lease_refresh_interval_seconds": 10})
    pq_a, pq_b = open_queue(cfg), open_queue(cfg)
    try:
        ids = publish(pq_a, 300)
        rec_a = Recorder(target=100)

        def handler_a(msg: Message) -> None:
            rec_a.start(msg)
            time.sleep(0.01)
            rec_a.done(msg)

        listener = Listener(pq_a.register_consumer("worker", [TOPIC]), handler_a,
                            max_workers=8, ack_flush_interval_seconds=DEADLINE, ack_batch_size=1000)
        run_until(listener, rec_a.reached)  # under load: 8 handlers busy, a poll possibly under way
        assert runtime_threads() == []
        handled_a = set(rec_a.handled)
        assert len(handled_a) == len(rec_a.handled) == listener.stats.processed
        assert len(rec_a.deliveries) == len(handled_a)  # every started handler finished
        assert listener.stats.ack_batches >= 1
        # A's acks were flushed and nothing of A's is left leased
        pending = {layout.parse_message_key(TOPIC, o.key)
                   for o in pq_a.store.list(layout.messages_prefix(TOPIC)).objects}
        assert pending == set(ids) - handled_a
        assert pq_a.topic_stats(TOPIC)["leased"] == 0
        rec_b = Recorder()

        def handler_b(msg: Message) -> None:
            rec_b.start(msg)
            rec_b.done(msg)

        result = drain(pq_b.register_consumer("worker", [TOPIC]), handler_b,
                       idle_timeout_seconds=1.0, threads=8)
        handled_b = set(rec_b.handled)
        assert handled_a | handled_b == set(ids)
        assert handled_a & handled_b == set()  # handled and acked: never redelivered
        assert result.processed == len(handled_b) == 300 - len(handled_a)
        assert pq_b.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    finally:
        pq_a.close()
        pq_b.close()
    assert all_pawnq_threads() == []


def test_leased_context_manager_refreshes_during_long_pull_mode_work() -> None:
    pq_a = memory_queue()
    pq_b = same_store(pq_a)
    clock = pq_a.context.clock
    try:
        publish(pq_a, 1)
        consumer = pq_a.register_consumer("puller", [TOPIC])
        rival = pq_b.register_consumer("rival", [TOPIC])
        [msg] = consumer.poll()
        stolen: list[Message] = []
        with consumer.leased(msg):
            assert [n for n in runtime_threads() if n.startswith("pawnq-refresher")]
            deadline = clock.monotonic() + 6.0  # long work: past the 4 s staleness
            while clock.monotonic() < deadline:
                clock.sleep(0.5)  # simulated work, with a rival polling in between
                stolen += rival.poll()
        assert runtime_threads() == []  # the refresher thread is gone after the block
        assert stolen == []
        assert msg.state == "leased"
        msg.ack()
        assert pq_a.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    finally:
        pq_a.close()
        pq_b.close()


# -- WorkerPool and pawnq worker on SeaweedFS ----------------------------------------------


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where worker processes record deliveries (inherited through the environment)."""
    path = tmp_path / "records"
    path.mkdir()
    monkeypatch.setenv("PAWNQ_TEST_RECORD_DIR", str(path))
    return path


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``predicate`` (reading files written by other processes) until true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def done_ids(record_dir: Path) -> set[str]:
    return {
        mid for events in runtime_handlers.read_records(str(record_dir)).values()
        for event, mid in events if event == "done"
    }


def test_worker_pool_survives_sigkill_of_a_child_twice(
    cfg: dict[str, Any], record_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads, ack_batch = 4, 8
    monkeypatch.setenv("PAWNQ_TEST_SLEEP", "0.02")
    pq = open_queue(cfg)
    try:
        ids = set(publish(pq, 1000))
        pool = WorkerPool(
            cfg, [TOPIC], "tests.runtime_handlers:record", processes=3, threads=threads,
            restart_backoff_seconds=0.2, listener_options={"ack_batch_size": ack_batch},
        )
        statuses: list[int] = []
        runner = run_in_thread(lambda: statuses.append(pool.run()))
        killed: list[int] = []
        for threshold in (250, 600):
            wait_for(lambda t=threshold: len(done_ids(record_dir)) >= t, f"{threshold} done")
            wait_for(lambda: 0 in pool.worker_pids(), "worker 0 to be running")
            pid = pool.worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            # worker 0's next process must have taken work before it is killed again
            wait_for(lambda p=pid: pool.worker_pids().get(0, p) != p, "worker 0 restart")
            wait_for(lambda: (record_dir / f"{pool.worker_pids().get(0)}.log").exists()
                     or len(done_ids(record_dir)) >= 1000, "the restarted worker to work")
        wait_for(lambda: done_ids(record_dir) >= ids, "every message handled")
        wait_for(lambda: pq.topic_stats(TOPIC)["pending"] == 0, "every message acked")
        pool.stop()
        join(runner)
        assert statuses == [RET_OK]
        assert pool.restarts == 2
        records = runtime_handlers.read_records(str(record_dir))
        starts = Counter(mid for events in records.values() for ev, mid in events
                         if ev == "start")
        assert set(starts) == ids  # none lost
        duplicates = sum(n - 1 for n in starts.values())
        # Every extra delivery repeats one a killed worker had in hand.
        in_killed = {mid for pid in killed for ev, mid in records.get(pid, []) if ev == "start"}
        assert {mid for mid, n in starts.items() if n > 1} <= in_killed
        # A worker holds at most threads + ack_batch_size messages unacked.
        assert duplicates <= len(killed) * (threads + ack_batch), duplicates
        # A worker killed between an ack's two DeleteObjects (messages, then their
        # leases) leaves leases of deleted messages; idle consumers list no leases, so a
        # janitor reaps them once they are stale.
        janitor = pq.register_consumer("janitor", topics=[TOPIC])
        wait_for(lambda: janitor.janitor(TOPIC) == 0, "leftover leases reaped")
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
        logging.getLogger(__name__).info("duplicates after 2 SIGKILLs: %d", duplicates)
    finally:
        pq.close()


def test_sigterm_to_the_pool_drains_in_flight_work_and_exits_0(
    cfg: dict[str, Any], record_dir: Path, tmp_path: Path
) -> None:
    pq = open_queue(cfg)
    try:
        ids = set(publish(pq, 200))
        config_path = tmp_path / "config.yaml"
        config_path.write_text(yaml.safe_dump(cfg))
        env = dict(os.environ, PYTHONPATH=str(REPO), PAWNQ_TEST_SLEEP="0.3")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pawn_queue_sync.cli.worker",
             "tests.runtime_handlers:record", "--topic", TOPIC, "--processes", "2",
             "--threads", "4", "--config", str(config_path), "-v"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            wait_for(lambda: len(done_ids(record_dir)) >= 16, "16 messages handled")
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=DEADLINE)
        finally:
            reap(proc)
        assert proc.returncode == RET_OK, out
        records = runtime_handlers.read_records(str(record_dir))
        started = Counter(mid for ev in records.values() for e, mid in ev if e == "start")
        done = Counter(mid for ev in records.values() for e, mid in ev if e == "done")
        assert started == done  # every handler in flight at SIGTERM finished
        assert max(started.values()) == 1
        stats = pq.topic_stats(TOPIC)
        assert stats == {"pending": 200 - len(done), "leased": 0, "dead_letter": 0}, out
        # what was not handled is still there, and nothing handled is
        left = {m.id for m in pq.register_consumer("check", [TOPIC]).poll(200)}
        assert left == ids - set(done)
    finally:
        pq.close()


def test_second_stop_kills_the_workers(
    cfg: dict[str, Any], record_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAWNQ_TEST_SLEEP", "120")  # a handler that will not finish
    pq = open_queue(cfg)
    try:
        [mid] = publish(pq, 1)
        pool = WorkerPool(cfg, [TOPIC], "tests.runtime_handlers:record", processes=1,
                          threads=1)
        statuses: list[int] = []
        runner = run_in_thread(lambda: statuses.append(pool.run()))
        wait_for(lambda: any(runtime_handlers.read_records(str(record_dir)).values()),
                 "the handler to start")
        [pid] = pool.worker_pids().values()
        started = time.monotonic()
        pool.stop()  # graceful: the worker waits for its handler (30 s by default) ...
        pool.stop()  # ... so the second request kills it
        join(runner)
        assert statuses == [RET_KILLED]
        assert time.monotonic() - started < 20
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert done_ids(record_dir) == set()
        [[(event, started_id)]] = runtime_handlers.read_records(str(record_dir)).values()
        assert (event, started_id) == ("start", mid)
        assert pq.topic_stats(TOPIC)["pending"] == 1  # its lease will expire: not lost
    finally:
        pq.close()


def test_worker_pool_exit_statuses_at_startup(
    cfg: dict[str, Any], real_s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    pq = open_queue(cfg)
    pq.close()
    handler = "tests.runtime_handlers:record"
    assert WorkerPool(cfg, [TOPIC], "tests.runtime_handlers:missing").run() == RET_IMPORT
    assert WorkerPool(cfg, [TOPIC], "tests.runtime_handlers:not_callable").run() == RET_IMPORT
    assert WorkerPool(cfg, [TOPIC], "no_such_module_here:f").run() == RET_IMPORT
    assert WorkerPool(cfg, ["no-such-topic"], handler).run() == RET_CONFIG
    unreachable = config_dict(real_s3, "unreachable-bucket", s3={
        "endpoint_url": "http://127.0.0.1:9", "connect_timeout_seconds": 0.5,
        "max_attempts": 1})
    assert WorkerPool(unreachable, [TOPIC], handler).run() == RET_CONNECT
    # the same through the command line
    assert worker_main([handler, "--topic", TOPIC, "--config", "/no/such.yaml"]) == RET_CONFIG
    assert worker_main(["tests.runtime_handlers:missing", "--topic", TOPIC]) == RET_IMPORT
    assert pawnq_main(["worker", "tests.runtime_handlers:missing", "-t", TOPIC]) == RET_IMPORT
    assert "has no attribute 'missing'" in caplog.text


# -- in-memory store: fault injection and exact request counts -----------------------------




@pytest.fixture
def mem_queue() -> Iterator[PawnQueue]:
    pq = memory_queue()
    yield pq
    pq.close()


def test_store_errors_in_the_poll_thread_are_retried_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(poller_module, "POLL_ERROR_WAIT_S", 0.05)
    failures = {"left": 3}
    lock = threading.Lock()

    def hooks(op: str, key: str) -> None:
        if op == "list" and key.endswith("/messages/"):
            with lock:
                if failures["left"] > 0:
                    failures["left"] -= 1
                    raise StorageError("injected: store unavailable")

    pq = memory_queue(hooks)
    try:
        ids = publish(pq, 20)
        rec = Recorder(target=20)

        def handler(msg: Message) -> None:
            rec.start(msg)
            rec.done(msg)

        listener = Listener(pq.register_consumer("c", [TOPIC]), handler, max_workers=4)
        run_until(listener, rec.reached)
        assert listener.stats.poll_errors == 3
        assert set(rec.deliveries) == set(ids) and max(rec.deliveries.values()) == 1
    finally:
        pq.close()


def test_prefetch_never_exceeds_free_workers() -> None:
    """Two workers blocked in their handlers: no third message is ever claimed."""
    release = threading.Event()
    extra_claim = threading.Event()
    started = threading.Semaphore(0)
    allowed: set[str] = set()
    watching = threading.Event()

    def hooks(op: str, key: str) -> None:
        # a lease written for any message but the two in hand is a claim
        if watching.is_set() and op == "put" and key.endswith(".lease") and key not in allowed:
            extra_claim.set()

    pq = memory_queue(hooks)
    try:
        publish(pq, 10)  # max_messages_per_poll is 10: one unbounded poll takes them all
        consumer = pq.register_consumer("c", [TOPIC])

        def handler(msg: Message) -> None:
            started.release()
            release.wait(DEADLINE)

        listener = Listener(consumer, handler, max_workers=2)
        runner = run_in_thread(listener.run)
        assert started.acquire(timeout=DEADLINE) and started.acquire(timeout=DEADLINE)
        assert len(consumer.inflight()) == 2
        allowed.update(m.lease_key for m in consumer.inflight())
        watching.set()
        # give the poll thread time to claim more if it would (lease refreshes, on the
        # allowed keys, happen every second meanwhile)
        assert not extra_claim.wait(1.5)
        assert len(consumer.inflight()) == 2
        release.set()
        listener.stop()
        join(runner)
        # (once released, the workers may have taken more before the stop: fine)
        assert listener.stats.claimed == listener.stats.processed + listener.stats.released
    finally:
        release.set()
        pq.close()


def test_retry_backoff_does_not_block_a_worker(mem_queue: PawnQueue) -> None:
    """One worker: while the failed message waits out its backoff (lease held), the
    other message is handled."""
    [first, second] = publish(mem_queue, 2)
    order: list[tuple[str, int]] = []
    both = threading.Event()

    def handler(msg: Message) -> None:
        order.append((msg.id, msg.delivery_count))
        if msg.id == first and msg.delivery_count == 1:
            raise RuntimeError("first attempt fails")
        if len({mid for mid, _ in order}) == 2 and (first, 2) in order:
            both.set()

    listener = Listener(mem_queue.register_consumer("c", [TOPIC]), handler, max_workers=1,
                        retry_backoff_seconds=1.0)
    run_until(listener, both)
    assert order == [(first, 1), (second, 1), (first, 2)]


def test_acks_are_batched(mem_queue: PawnQueue) -> None:
    """Acks go out as DeleteObjects batches: far fewer delete requests than messages."""
    requests: Counter[str] = Counter()
    store = mem_queue.store
    delete, delete_many = store.delete, store.delete_many

    def counting_delete(key: str, **kw: Any) -> None:
        requests["delete"] += 1
        delete(key, **kw)

    def counting_delete_many(keys: Any, **kw: Any) -> list[str]:
        requests["delete_many"] += 1
        return delete_many(keys, **kw)

    store.delete = counting_delete  # type: ignore[method-assign]
    store.delete_many = counting_delete_many  # type: ignore[method-assign]
    publish(mem_queue, 200)
    result = drain(mem_queue.register_consumer("c", [TOPIC]), lambda m: None,
                   idle_timeout_seconds=0.3, threads=8)
    assert result == DrainResult(200, 0, 0)
    assert mem_queue.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    # unbatched: 2 requests per message (message, then lease) = 400
    assert requests["delete"] + requests["delete_many"] <= 400 / 4, requests


def test_drain_max_messages_claims_no_more(mem_queue: PawnQueue) -> None:
    publish(mem_queue, 50)
    seen: list[str] = []
    result = drain(mem_queue.register_consumer("c", [TOPIC]), lambda m: seen.append(m.id),
                   max_messages=7, threads=4, idle_timeout_seconds=5)
    assert result == DrainResult(7, 0, 0) and len(set(seen)) == 7
    assert mem_queue.topic_stats(TOPIC) == {"pending": 43, "leased": 0, "dead_letter": 0}
    assert runtime_threads() == []


def test_sigterm_stops_a_listener_with_installed_handlers(mem_queue: PawnQueue) -> None:
    assert threading.current_thread() is threading.main_thread()
    publish(mem_queue, 30)
    first = threading.Event()
    before = signal.getsignal(signal.SIGTERM)

    def handler(msg: Message) -> None:
        first.set()

    killer = run_in_thread(lambda: first.wait(DEADLINE) and os.kill(os.getpid(),
                                                                     signal.SIGTERM))
    listener = Listener(mem_queue.register_consumer("c", [TOPIC]), handler, max_workers=2,
                        install_signal_handlers=True)
    listener.run()  # returns once SIGTERM arrived
    join(killer)
    assert signal.getsignal(signal.SIGTERM) is before
    stats = mem_queue.topic_stats(TOPIC)
    assert stats["leased"] == 0
    assert stats["pending"] == 30 - listener.stats.processed
    assert runtime_threads() == []


def test_sigterm_delivered_to_another_thread_still_stops_the_listener(
    mem_queue: PawnQueue,
) -> None:
    """The kernel may hand a process's signal to any thread; Python runs the handler in
    the main thread only once that thread runs Python code. The main thread waiting
    for the stop must still wake (it used to wait forever)."""
    assert threading.current_thread() is threading.main_thread()
    publish(mem_queue, 5)
    first = threading.Event()
    listener = Listener(mem_queue.register_consumer("c", [TOPIC]), lambda m: first.set(),
                        max_workers=2, install_signal_handlers=True)
    # a SIGTERM aimed at this helper thread, not the main one
    killer = run_in_thread(lambda: first.wait(DEADLINE)
                           and signal.pthread_kill(threading.get_ident(), signal.SIGTERM))
    timed_out = threading.Event()
    watchdog = threading.Timer(DEADLINE, lambda: (timed_out.set(), listener.stop()))
    watchdog.start()
    try:
        listener.run()  # returns once the SIGTERM is handled
    finally:
        watchdog.cancel()
    join(killer)
    assert first.is_set() and not timed_out.is_set()
    assert runtime_threads() == []


def test_messages_claimed_while_stopping_are_released_at_once() -> None:
    """stop() while a poll is claiming: what it claims is given back, never handled."""
    in_claim, go_on = threading.Event(), threading.Event()

    def hooks(op: str, key: str) -> None:
        if op == "get" and "/messages/" in key:  # the claim's GET of the message body
            in_claim.set()
            go_on.wait(DEADLINE)

    pq = memory_queue(hooks)
    try:
        publish(pq, 3)
        handled: list[str] = []
        listener = Listener(pq.register_consumer("c", [TOPIC]), lambda m: handled.append(m.id),
                            max_workers=4)
        runner = run_in_thread(listener.run)
        assert in_claim.wait(DEADLINE)
        listener.stop()
        wait_for(lambda: listener._s.stopping, "the shutdown to begin")
        go_on.set()
        join(runner)
        assert handled == []
        assert listener.stats.released == listener.stats.claimed == 3
        assert pq.topic_stats(TOPIC) == {"pending": 3, "leased": 0, "dead_letter": 0}
    finally:
        go_on.set()
        pq.close()


def test_stop_timeout_abandons_a_stuck_handler_which_still_acks_later(
    mem_queue: PawnQueue, caplog: pytest.LogCaptureFixture
) -> None:
    publish(mem_queue, 1)
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def stuck(msg: Message) -> None:
        entered.set()
        release.wait(DEADLINE)
        returned.set()

    listener = Listener(mem_queue.register_consumer("c", [TOPIC]), stuck, max_workers=1)
    runner = run_in_thread(listener.run)
    assert entered.wait(DEADLINE)
    listener.stop(timeout=0.2)
    assert listener.join(DEADLINE)  # run() returned although the handler still runs
    assert not returned.is_set() and listener.unfinished == 1
    assert "still running after the shutdown timeout" in caplog.text
    assert [n for n in runtime_threads() if "refresher" in n or "poll" in n] == []
    release.set()
    assert returned.wait(DEADLINE)
    join(runner)
    wait_for(lambda: mem_queue.topic_stats(TOPIC)["pending"] == 0, "the late ack")
    wait_for(lambda: runtime_threads() == [], "the handler thread to end")


def test_refresher_marks_a_lost_lease_and_stops_tracking_it(mem_queue: PawnQueue) -> None:
    publish(mem_queue, 1)
    consumer = mem_queue.register_consumer("c", [TOPIC])
    [msg] = consumer.poll()
    mem_queue.store.delete(msg.lease_key)  # as if it had gone stale and been reaped
    lost = threading.Event()
    refresher = LeaseRefresher(consumer, interval_seconds=0.05, on_lost=lambda m: lost.set())
    refresher.track(msg)
    with refresher:
        assert lost.wait(DEADLINE)
    assert msg.state == "lost" and msg.done
    assert len(refresher) == 0 and refresher.lost == 1
    assert not refresher.alive and runtime_threads() == []


def test_close_stops_a_running_listener_and_leaves_no_thread() -> None:
    """PawnQueue.close() stops a listen() running in another thread gracefully: the
    handler in progress finishes and is acked, and no thread of ours outlives close()."""
    pq = memory_queue()
    producer = pq.register_producer("p")
    producer.publish_batch(TOPIC, [{"n": n} for n in range(20)])
    consumer = pq.register_consumer("c", [TOPIC])
    started, release = threading.Event(), threading.Event()
    handled: list[str] = []

    def handler(msg: Message) -> None:
        started.set()
        release.wait(DEADLINE)
        handled.append(msg.id)

    runner = run_in_thread(lambda: consumer.listen(handler, max_workers=1))
    assert started.wait(DEADLINE)
    closer = run_in_thread(pq.close)
    release.set()
    join(closer)
    join(runner)
    assert all_pawnq_threads() == []
    store = pq._given_store
    assert store is not None
    pending = store.list(layout.messages_prefix(TOPIC)).objects
    assert len(handled) >= 1
    assert len(pending) == 20 - len(handled)  # handled ones acked, the rest still there
    assert store.list(layout.leases_prefix(TOPIC)).objects == []  # unstarted ones released


def test_an_idle_listener_lists_once_per_interval_from_the_start(
    cfg: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an empty topic every pause between polls is at least ``interval_seconds``
    from the first poll on, and each poll is one LIST: <= 1 request per interval. The
    pauses are recorded, not slept: the listener stops after the fourth."""
    pq = open_queue(cfg)
    consumer = pq.register_consumer("idle", [TOPIC])
    sent: Counter[str] = Counter()
    pq.store._client().meta.events.register(  # type: ignore[attr-defined]
        "before-send.s3", lambda event_name, **_: sent.update([event_name.rsplit(".", 1)[-1]])
    )
    waits: list[float] = []
    original = poller_module.Poller._wait

    def recorded(self: poller_module.Poller, seconds: float) -> bool:
        if threading.current_thread().name.startswith("pawnq-poll-"):
            waits.append(seconds)
            if len(waits) >= 4:
                self._s.request_stop()
                return True
            return False  # no sleeping: the next poll follows at once
        return original(self, seconds)

    monkeypatch.setattr(poller_module.Poller, "_wait", recorded)
    try:
        consumer.listen(lambda msg: None, max_workers=2)
    finally:
        pq.close()
    assert len(waits) == 4
    assert all(w >= POLLING["interval_seconds"] for w in waits), waits
    assert sent == Counter({"ListObjectsV2": 4}), sent
