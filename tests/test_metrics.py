"""Prometheus metrics (issue 16): ``pawnq worker --metrics-port`` with two worker
processes serves, over HTTP, the sum of the workers' counters (prometheus-client's
multiprocess mode): the acks counted equal the messages consumed, on a plain and a
packed topic on SeaweedFS; depth gauges come from ``pq.stats()`` at most once per
interval; without prometheus-client everything imports and the metrics say what to
install."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.errors import MissingExtra
from pawn_queue_sync.testing import memory_queue
from tests.servers import S3Server, config_dict

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "metered"
MESSAGES = 120
DEADLINE = 120.0


def handle(msg: Any) -> None:
    """The workers' handler: a little work, so both processes take some."""
    time.sleep(0.005)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with exactly these labels, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.index("}") + 1]))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_pawnq_worker_serves_the_sum_of_its_workers_metrics(
    real_s3: S3Server, real_bucket: str, tmp_path: Path, packed: bool
) -> None:
    cfg = config_dict(real_s3, real_bucket, publishing={"max_segment_messages": 10},
                      polling={"interval_seconds": 0.2, "max_messages_per_poll": 5})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if k != "PROMETHEUS_MULTIPROC_DIR" and not k.startswith("PAWNQUEUE_")}
    with PawnQueue(load_config(cfg)) as pq:
        pq.create_topic(TOPIC, packed=packed)
        ids = pq.register_producer("p").publish_batch(TOPIC, list(range(MESSAGES)))
        assert len(set(ids)) == MESSAGES
        proc = subprocess.Popen(
            [sys.executable, "-m", "pawn_queue_sync", "worker", "tests.test_metrics:handle",
             "--topic", TOPIC, "--processes", "2", "--threads", "2", "--config",
             str(config_file), "--metrics-port", str(port), "--metrics-addr", "127.0.0.1",
             "--consumer-name", "metered"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + DEADLINE
            text, acked = "", None
            while acked != MESSAGES:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, f"acked {acked} of {MESSAGES}\n{text}"
                time.sleep(0.5)
                try:
                    text = _scrape(port)
                except OSError:
                    continue  # not serving yet
                acked = _sample(text, "pawnq_events_total", kind="acked", topic=TOPIC)
            stats = pq.stats(TOPIC)
            assert (stats.pending, stats.in_flight, stats.dead_lettered) == (0, 0, 0)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=DEADLINE)[0]
    assert proc.returncode == 0, output
    # every message consumed once, counted once across the two processes
    assert _sample(text, "pawnq_events_total", kind="claimed", topic=TOPIC) == MESSAGES
    assert _sample(text, "pawnq_handler_duration_seconds_count", topic=TOPIC,
                   outcome="acked") == MESSAGES
    assert _sample(text, "pawnq_events_total", kind="published", topic=TOPIC) is None
    # both processes counted (their own files in the multiprocess directory)
    assert _sample(text, "pawnq_topic_pending_messages", topic=TOPIC) is not None


def test_depth_gauges_ask_stats_at_most_once_per_interval() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from pawn_queue_sync.metrics import PrometheusMetrics

    now = [0.0]
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    pq = memory_queue(topics=[TOPIC])
    try:
        pq.events.subscribe(metrics)
        producer = pq.register_producer("p")
        for i in range(3):
            producer.publish(TOPIC, i)
        collector = metrics.watch(pq, [TOPIC], min_interval=10)
        collector._clock = lambda: now[0]
        text = generate_latest(registry).decode()
        assert _sample(text, "pawnq_topic_pending_messages", topic=TOPIC) == 3
        consumer = pq.register_consumer("c", [TOPIC])
        consumer.ack_many(consumer.poll(3))
        now[0] = 9.0  # within the interval: the last answer
        text = generate_latest(registry).decode()
        assert _sample(text, "pawnq_topic_pending_messages", topic=TOPIC) == 3
        assert collector.refreshes == 1
        now[0] = 10.0
        assert pq.events.flush(10)
        text = generate_latest(registry).decode()
        assert _sample(text, "pawnq_topic_pending_messages", topic=TOPIC) == 0
        assert collector.refreshes == 2
        assert _sample(text, "pawnq_events_total", kind="acked", topic=TOPIC) == 3
        assert _sample(text, "pawnq_events_total", kind="published", topic=TOPIC) == 3
    finally:
        pq.close()


def test_without_prometheus_client_the_extra_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # an import fails
    from pawn_queue_sync import metrics
    from pawn_queue_sync.cli.worker import main as worker_main
    from pawn_queue_sync.workers import RET_CONFIG, WorkerPool

    with pytest.raises(MissingExtra, match=r"pip install 'pawn-queue-sync\[metrics\]'"):
        metrics.PrometheusMetrics()
    with pytest.raises(MissingExtra, match="pawn-queue-sync"):
        WorkerPool(None, [TOPIC], "tests.test_metrics:handle", metrics_port=9108)
    assert worker_main(["tests.test_metrics:handle", "--topic", TOPIC,
                        "--metrics-port", "9108"]) == RET_CONFIG


def test_the_package_imports_without_prometheus_client() -> None:
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "import pawn_queue_sync, pawn_queue_sync.metrics, pawn_queue_sync.workers\n"
            "from pawn_queue_sync.testing import memory_queue\n"
            "with memory_queue(topics=['t']) as pq:\n"
            "    pq.register_producer('p').publish('t', 1)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("port", [-1, 65536, True, "9108"])
def test_a_bad_metrics_port_is_refused(port: Any) -> None:
    from pawn_queue_sync.workers import WorkerPool

    with pytest.raises(ValueError, match="metrics_port"):
        WorkerPool(None, [TOPIC], "tests.test_metrics:handle", metrics_port=port)


def test_a_port_in_use_stops_the_pool_before_any_worker_starts(tmp_path: Path) -> None:
    from pawn_queue_sync.workers import RET_CONFIG, WorkerPool

    cfg = {"local": {"path": str(tmp_path / "store")}}
    with PawnQueue(load_config(cfg)) as pq:
        pq.create_topic(TOPIC)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        pool = WorkerPool(cfg, [TOPIC], "tests.test_metrics:handle", processes=1,
                          metrics_port=taken.getsockname()[1], metrics_addr="127.0.0.1",
                          install_signal_handlers=False)
        assert pool.run() == RET_CONFIG
    assert pool.worker_pids() == {} and pool.restarts == 0
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # put back as it was


def _noop() -> None:
    """A process that does nothing (starts the fork server)."""


@pytest.mark.slow
def test_forkserver_workers_count_into_the_directory_their_supervisor_made(
    tmp_path: Path,
) -> None:
    """The fork server is started before the pool sets PROMETHEUS_MULTIPROC_DIR, so its
    children do not inherit it: the directory travels in their spec."""
    import multiprocessing
    import threading

    from pawn_queue_sync.workers import RET_OK, WorkerPool

    server = multiprocessing.get_context("forkserver").Process(target=_noop)
    server.start()  # the fork server runs now, with no multiprocess directory set
    server.join()
    cfg = {"local": {"path": str(tmp_path / "store")},
           "polling": {"interval_seconds": 0.2, "max_messages_per_poll": 5}}
    with PawnQueue(load_config(cfg)) as pq:
        pq.create_topic(TOPIC)
        pq.register_producer("p").publish_batch(TOPIC, list(range(40)))
        port = _free_port()
        pool = WorkerPool(cfg, [TOPIC], "tests.test_metrics:handle", processes=2, threads=2,
                          start_method="forkserver", metrics_port=port,
                          metrics_addr="127.0.0.1", install_signal_handlers=False)
        statuses: list[int] = []
        runner = threading.Thread(target=lambda: statuses.append(pool.run()), daemon=True)
        runner.start()
        try:
            deadline, acked, text = time.monotonic() + DEADLINE, None, ""
            while acked != 40:
                assert runner.is_alive(), statuses
                assert time.monotonic() < deadline, f"acked {acked}\n{text}"
                time.sleep(0.3)
                try:
                    text = _scrape(port)
                except OSError:
                    continue
                acked = _sample(text, "pawnq_events_total", kind="acked", topic=TOPIC)
        finally:
            pool.stop()
            runner.join(DEADLINE)
        assert statuses == [RET_OK]
        assert pq.stats(TOPIC).pending == 0
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_pawnq_worker_refuses_a_bad_metrics_port_as_a_usage_error(port: str) -> None:
    from pawn_queue_sync.cli import main as pawnq_main

    with pytest.raises(SystemExit) as stopped:
        pawnq_main(["worker", "tests.test_metrics:handle", "--topic", TOPIC,
                    "--metrics-port", port])
    assert stopped.value.code == 2
