"""Review 16B (R2) of issue 16's events and metrics: regressions.

- a callback raising a BaseException (SystemExit, KeyboardInterrupt) killed the event
  dispatcher for good: no later event reached any callback;
- ``pawnq_topic_consumers_alive{topic}`` counted every registered consumer for every
  topic (the registry does not record topics): now one ``pawnq_consumers_alive``;
- a ``PROMETHEUS_MULTIPROC_DIR`` naming a missing directory was a ValueError traceback,
  not a configuration error;
- ``pawnq worker --metrics-addr`` (and ``WorkerPool``/``serve``) bound every interface
  by default, unlike the dashboard: loopback now.
"""

from __future__ import annotations

import argparse
import inspect
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.errors import ConfigError
from pawn_queue_sync.events import Event, EventBus
from pawn_queue_sync.testing import memory_queue

TOPIC = "metered"


def handle(msg: object) -> None:
    """The workers' handler."""


def _event(i: int) -> Event:
    return Event("published", "t", str(i), datetime.now(timezone.utc))


# -- events ------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_a_callback_raising_a_base_exception_does_not_stop_every_later_event(
    exc: BaseException,
) -> None:
    """Reproduces: ``_call`` caught Exception only, so the BaseException ended the
    dispatcher thread while ``_thread`` still named it; ``publish`` starts a thread only
    when there is none: every later event stayed queued (flush timed out)."""
    seen: list[str | None] = []

    def callback(event: Event) -> None:
        seen.append(event.message_id)
        if event.message_id == "1":
            raise exc

    bus = EventBus([callback])
    try:
        for i in range(4):
            assert bus.publish(_event(i))
        assert bus.flush(timeout=10), "events stuck in the queue: the dispatcher is dead"
        assert seen == ["0", "1", "2", "3"]
        assert bus.errors == 1
    finally:
        bus.close(timeout=1)


def test_a_consumers_own_callback_survives_another_callbacks_base_exception() -> None:
    """The same through the queue: the queue's callback exits once; the consumer's own
    on_event still hears of the messages it claims and acks."""
    mine: list[str] = []
    first = threading.Event()

    def exiting(event: Event) -> None:
        if not first.is_set():
            first.set()
            raise SystemExit(0)

    pq = memory_queue(topics=["t"])
    pq.events.subscribe(exiting)
    try:
        producer = pq.register_producer("p")
        producer.publish("t", 0)
        assert first.wait(10)
        consumer = pq.register_consumer("c", ["t"], on_event=lambda e: mine.append(e.kind))
        msgs = consumer.poll(1)
        consumer.ack_many(msgs)
        assert pq.events.flush(10), "the dispatcher died: nothing is handed out any more"
        assert mine == ["claimed", "acked"]
    finally:
        pq.close()


def test_a_dispatcher_thread_that_died_is_started_again() -> None:
    """Whatever ends the dispatcher thread (here: its loop made to raise once, as a
    failure outside any callback would), the next publish starts a new one and every
    queued event is still handed out."""
    seen: list[str | None] = []
    bus = EventBus([lambda e: seen.append(e.message_id)])
    real_run = bus._run
    broken = threading.Event()

    def run_once_broken() -> None:
        if not broken.is_set():
            broken.set()
            raise SystemExit  # the thread ends before handing anything out
        real_run()

    bus._run = run_once_broken  # type: ignore[method-assign]
    try:
        assert bus.publish(_event(0))
        assert broken.wait(10)
        dead = bus._thread
        if dead is not None:
            dead.join(10)
        assert bus.publish(_event(1))
        assert bus.flush(timeout=10), "no dispatcher runs: events stuck in the queue"
        assert seen == ["0", "1"]
    finally:
        bus.close(timeout=1)


# -- metrics -----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _prometheus_value_class() -> Any:
    """prometheus-client picks its value class (single- or multi-process) when first
    imported, from PROMETHEUS_MULTIPROC_DIR: import it here, before a test sets that
    variable, and put the class back after, so no later test in this process counts
    into a directory that is gone (test_metrics' gauges then raised TypeError)."""
    from prometheus_client import values

    before = values.ValueClass
    yield
    values.ValueClass = before


def test_a_stale_multiproc_dir_is_a_config_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Reproduces: PoolMetrics.start() kept a PROMETHEUS_MULTIPROC_DIR naming a missing
    directory and MultiProcessCollector raised ValueError before the ``try`` that turns a
    bind failure into RET_CONFIG: WorkerPool.run() died with a traceback."""
    from pawn_queue_sync.workers import RET_CONFIG, WorkerPool

    cfg = {"local": {"path": str(tmp_path / "store")}}
    with PawnQueue(load_config(cfg)) as pq:
        pq.create_topic(TOPIC)
    gone = tmp_path / "gone"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(gone))
    pool = WorkerPool(cfg, [TOPIC], "tests.test_review_events_metrics:handle",
                      processes=1, metrics_port=0, metrics_addr="127.0.0.1",
                      install_signal_handlers=False)
    assert pool.run() == RET_CONFIG
    assert pool.worker_pids() == {}
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(gone)  # left as it was
    assert not gone.exists()  # nothing made behind the user's back
    assert any("PROMETHEUS_MULTIPROC_DIR" in r.getMessage() and str(gone) in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_serve_with_a_stale_multiproc_dir_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pawn_queue_sync.metrics import serve

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR"):
        serve(0, "127.0.0.1")


def test_consumers_alive_is_one_gauge_not_a_count_per_topic() -> None:
    """Reproduces: ``pawnq_topic_consumers_alive{topic}`` gave topic 'unread' (nobody
    reads it) the other topic's consumer, and a sum over topics counted each consumer
    once per topic. The registry does not record topics: one unlabelled gauge."""
    from prometheus_client import CollectorRegistry

    from pawn_queue_sync.metrics import PrometheusMetrics

    pq = memory_queue(topics=["read", "unread", "other"])
    try:
        for name in ("reads-read", "reads-other"):
            pq.register_consumer(name, [name.split("-")[1]]).poll(1)  # a heartbeat
        registry = CollectorRegistry()
        PrometheusMetrics(registry).watch(pq, min_interval=0)
        assert registry.get_sample_value("pawnq_topic_consumers_alive",
                                         {"topic": "unread"}) is None
        assert registry.get_sample_value("pawnq_consumers_alive") == 2.0
        assert registry.get_sample_value("pawnq_topic_pending_messages",
                                         {"topic": "unread"}) == 0.0
    finally:
        pq.close()


def test_metrics_are_served_on_loopback_by_default() -> None:
    """``pawnq worker --metrics-port`` without ``--metrics-addr``, ``WorkerPool`` and
    ``serve`` bound 0.0.0.0 (every interface) while the dashboard keeps to loopback."""
    from pawn_queue_sync.cli.worker import _add_arguments
    from pawn_queue_sync.metrics import serve
    from pawn_queue_sync.workers import WorkerPool

    parser = argparse.ArgumentParser()
    _add_arguments(parser, config_default=None)
    args = parser.parse_args(["tests.test_review_events_metrics:handle", "-t", TOPIC,
                              "--metrics-port", "0"])
    assert args.metrics_addr == "127.0.0.1"
    assert inspect.signature(WorkerPool).parameters["metrics_addr"].default == "127.0.0.1"
    assert inspect.signature(serve).parameters["addr"].default == "127.0.0.1"
