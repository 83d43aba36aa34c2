"""Regressions of the worker pool (``WorkerPool``, ``pawnq worker``).

Pools here are real: spawn-started children on the embedded local store (shared by
processes through its directory), or the ``pawnq`` console script of this venv.
Handlers record deliveries through :mod:`tests.runtime_handlers` (one file per process).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pawn_queue_sync import PawnQueue, cli, workers
from pawn_queue_sync.cli import main as pawnq_main
from pawn_queue_sync.cli.worker import main as worker_main
from pawn_queue_sync.workers import RET_OK, WorkerPool
from tests import runtime_handlers
from tests.short_leases import reap

REPO = Path(__file__).resolve().parent.parent
TOPIC = "jobs"
#: No test waits longer than this for anything: fail, never hang.
DEADLINE = 90.0
POLLING = {"interval_seconds": 0.2, "visibility_timeout_seconds": 10, "jitter_max_ms": 20,
           "lease_refresh_interval_seconds": 2, "max_messages_per_poll": 4}


def local_config(path: Path) -> dict[str, Any]:
    return {"local": {"path": str(path)}, "polling": dict(POLLING)}


def open_topic(cfg: dict[str, Any], publish: int = 0) -> tuple[PawnQueue, set[str]]:
    pq = PawnQueue.from_config(cfg).setup()
    pq.create_topic(TOPIC)
    ids: list[str] = []
    if publish:
        ids = pq.register_producer("producer").publish_batch(
            TOPIC, [{"n": i} for i in range(publish)])
    return pq, set(ids)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``predicate`` (reading files other processes write) until true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def records(directory: Path, event: str) -> Counter[str]:
    return Counter(mid for evs in runtime_handlers.read_records(str(directory)).values()
                   for ev, mid in evs if ev == event)


# -- 1. Ctrl-C (SIGINT to the process group) stops the pool cleanly ---------------------------


@pytest.mark.parametrize("run", range(5))
def test_ctrl_c_to_the_process_group_stops_the_pool_cleanly(tmp_path: Path, run: int) -> None:
    """Ctrl-C sends SIGINT to every process of the group, and the supervisor relays
    SIGTERM: a child receives both at once, and Linux may hand them to any of its
    threads. Python runs the handler only when the main thread runs Python code, and
    the child's main thread waited in select() with no timeout and no wakeup fd: it
    kept claiming until the supervisor SIGKILLed it (exit 1), most runs out of 8."""
    cfg = local_config(tmp_path / "store")
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    pq, ids = open_topic(cfg, publish=200)
    try:
        config_path = tmp_path / "config.yaml"
        config_path.write_text(yaml.safe_dump(cfg))
        env = dict(os.environ, PYTHONPATH=str(REPO), PAWNQ_TEST_SLEEP="0.2",
                   PAWNQ_TEST_RECORD_DIR=str(record_dir))
        proc = subprocess.Popen(
            [sys.executable, "-m", "pawn_queue_sync.cli.worker",
             "tests.runtime_handlers:record", "--topic", TOPIC, "--processes", "2",
             "--threads", "4", "--config", str(config_path), "--shutdown-timeout", "5",
             "-v"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group, as a shell job has
        )
        try:
            wait_for(lambda: len(records(record_dir, "done")) >= 16, "16 messages handled")
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            out, _ = proc.communicate(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == RET_OK, out
        assert "0 worker(s) killed" in out, out  # no SIGKILL was needed
        started, done = records(record_dir, "start"), records(record_dir, "done")
        assert started == done, out  # every handler in flight finished
        assert max(started.values()) == 1
        assert pq.topic_stats(TOPIC) == {"pending": 200 - len(done), "leased": 0,
                                         "dead_letter": 0}, out
        left = {m.id for m in pq.register_consumer("check", [TOPIC]).poll(200)}
        assert left == ids - set(done)  # nothing lost, nothing handled left behind
    finally:
        pq.close()


# -- 2. children that can never start: give up -------------------------------------------------


#: A handler module that serves metrics on a fixed port from import time, as apps do
#: with prometheus_client.start_http_server: the supervisor imports it first (its
#: preflight) and holds the port, so every worker's import fails with EADDRINUSE.
METRICS_APP = textwrap.dedent('''
    import os
    import socket

    _metrics = socket.socket()
    _metrics.bind(("127.0.0.1", int(os.environ["METRICS_APP_PORT"])))
    _metrics.listen()


    def handle(msg):
        pass
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_children_that_never_start_make_the_pool_give_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler imports in the supervisor but not in its workers: each worker
    exited at import and was restarted forever, and the pool (until stopped) exited 0
    having consumed nothing. Now it gives up after MAX_START_FAILURES start failures
    in a row with RET_START_FAILED."""
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "metrics_app_handlers.py").write_text(METRICS_APP)
    monkeypatch.syspath_prepend(str(app_dir))  # spawn gives the children our sys.path
    monkeypatch.setenv("METRICS_APP_PORT", str(free_port()))
    cfg = local_config(tmp_path / "store")
    pq, _ = open_topic(cfg, publish=10)
    try:
        pool = WorkerPool(cfg, [TOPIC], "metrics_app_handlers:handle", processes=2,
                          threads=1, restart_backoff_seconds=0.05, restart_backoff_max_seconds=0.2)
        statuses: list[int] = []
        runner = threading.Thread(target=lambda: statuses.append(pool.run()), daemon=True)
        runner.start()
        runner.join(60)
        if runner.is_alive():
            restarts = pool.restarts
            pool.stop()
            runner.join(DEADLINE)
            pytest.fail(f"the pool was still restarting workers after 60 s "
                        f"({restarts} restarts), statuses {statuses}")
        assert statuses == [workers.RET_START_FAILED]
        assert pool.restarts >= workers.MAX_START_FAILURES - 1
        assert pq.topic_stats(TOPIC)["pending"] == 10
    finally:
        sys.modules.pop("metrics_app_handlers", None)  # closes the port with the module
        pq.close()


def test_start_failed_status_is_a_documented_cli_exit_code() -> None:
    RET_START_FAILED = workers.RET_START_FAILED
    assert RET_START_FAILED not in (0, 1, 2, 3, 4, 5)
    assert cli.EXIT_WORKERS_FAILED_TO_START == RET_START_FAILED
    readme = (REPO / "README.md").read_text()
    assert f"| {RET_START_FAILED} | `EXIT_WORKERS_FAILED_TO_START` |" in readme
    runtime_doc = (REPO / "docs" / "runtime.md").read_text()
    assert "RET_START_FAILED" in runtime_doc


# -- 3. --shutdown-timeout must be a finite, non-negative number -------------------------------


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_worker_pool_refuses_a_shutdown_timeout_that_is_not_finite(value: float) -> None:
    """inf/nan used to be accepted and crash the supervisor at the first SIGTERM
    (a wait with an infinite or NaN timeout)."""
    with pytest.raises(ValueError, match="shutdown_timeout"):
        WorkerPool({"local": {"path": "/nonexistent"}}, [TOPIC],
                   "tests.runtime_handlers:record", shutdown_timeout_seconds=value)


@pytest.mark.parametrize("text", ["inf", "nan", "-1", "-inf"])
def test_cli_refuses_a_shutdown_timeout_that_is_not_finite(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for run in (lambda a: worker_main(a), lambda a: pawnq_main(["worker", *a])):
        with pytest.raises(SystemExit) as exc:
            run(["tests.runtime_handlers:record", "--topic", TOPIC,
                 f"--shutdown-timeout={text}"])
        assert exc.value.code == cli.EXIT_USAGE
        assert "--shutdown-timeout" in capsys.readouterr().err


# -- 4. pawnq worker imports handlers from the working directory -------------------------------


MYAPP_HANDLERS = textwrap.dedent('''
    import os


    def handle(msg):
        path = os.path.join(os.environ["MYAPP_OUT"], f"{msg.id}.{os.getpid()}")
        with open(path, "w"):
            pass
''')


def test_pawnq_worker_imports_the_handler_from_the_working_directory(tmp_path: Path) -> None:
    """``pawnq worker myapp.handlers:handle`` from the project directory failed with
    "No module named 'myapp'": the console script does not put the working directory
    on sys.path, as ``python -m`` does. Two spawn-started workers must import it too."""
    project = tmp_path / "project"
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "handlers.py").write_text(MYAPP_HANDLERS)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    cfg = local_config(tmp_path / "store")
    (project / "config.yaml").write_text(yaml.safe_dump(cfg))
    pq, ids = open_topic(cfg, publish=40)
    pawnq = Path(sys.executable).parent / "pawnq"
    assert pawnq.exists(), pawnq
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MYAPP_OUT"] = str(out_dir)
    try:
        proc = subprocess.Popen(
            [str(pawnq), "-v", "worker", "myapp.handlers:handle", "--topic", TOPIC,
             "--config", "config.yaml", "--processes", "2", "--threads", "2"],
            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for(lambda: proc.poll() is not None
                     or {n.split(".")[0] for n in os.listdir(out_dir)} >= ids,
                     "every message handled")
            wait_for(lambda: proc.poll() is not None
                     or pq.topic_stats(TOPIC)["pending"] == 0, "every message acked")
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=DEADLINE)
        finally:
            reap(proc)
        assert proc.returncode == RET_OK, out
        handled = [n.split(".") for n in os.listdir(out_dir)]
        assert {mid for mid, _ in handled} == ids
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    finally:
        pq.close()


# -- 5. a stop while children are still starting: they stop cleanly ---------------------------


#: Runs at interpreter start in every spawned child (first on PYTHONPATH), before any of
#: our code: while $PAWNQ_TEST_START_GATE is set, it says it started and waits until
#: the test opens the gate, so the children stay in their slow start deterministically.
SLOW_START = textwrap.dedent('''
    import os
    import time

    _gate = os.environ.get("PAWNQ_TEST_START_GATE")
    if _gate:
        open(os.path.join(_gate, f"entered.{os.getpid()}"), "w").close()
        _until = time.monotonic() + 120  # never hang a child forever
        while not os.path.exists(os.path.join(_gate, "open")) and time.monotonic() < _until:
            time.sleep(0.02)
''')


def test_a_stop_while_the_children_start_stops_them_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool blocked SIGINT/SIGTERM around ``proc.start()`` believing the child
    inherits the blocked mask, but a spawn child is a fresh exec'd interpreter with an
    empty mask: a stop during its start (interpreter start, unpickling, imports) relayed
    SIGTERM and killed it before it installed its handlers (exit -15), and the pool
    exited 1 ("worker exit codes: [-15, -15]") although nothing had gone wrong."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text(SLOW_START)
    gate = tmp_path / "gate"
    gate.mkdir()
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(site_dir), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("PAWNQ_TEST_START_GATE", str(gate))
    monkeypatch.setenv("PAWNQ_TEST_RECORD_DIR", str(record_dir))
    caplog.set_level(logging.INFO, logger="pawn_queue_sync.workers")
    cfg = local_config(tmp_path / "store")
    pq, ids = open_topic(cfg, publish=6)
    try:
        pool = WorkerPool(cfg, [TOPIC], "tests.runtime_handlers:record", processes=2,
                          threads=1, shutdown_timeout_seconds=5,
                          install_signal_handlers=False)
        statuses: list[int] = []
        runner = threading.Thread(target=lambda: statuses.append(pool.run()), daemon=True)
        runner.start()
        try:
            # both children exist and are inside their slow start
            wait_for(lambda: len(pool.worker_pids()) == 2
                     and {f"entered.{p}" for p in pool.worker_pids().values()}
                     <= {p.name for p in gate.iterdir()}, "2 children starting")
            pool.stop()
            # the pool has acted on the stop: it says so, or the children died of it
            wait_for(lambda: not pool.worker_pids() or any(
                "still starting" in r.getMessage() for r in caplog.records),
                "the pool acting on the stop")
        finally:
            (gate / "open").touch()
            runner.join(DEADLINE)
            if runner.is_alive():
                pool.stop(hard=True)
                runner.join(DEADLINE)
        exits = [r.args for r in caplog.records
                 if r.name == "pawn_queue_sync.workers" and r.msg.startswith("worker %d (pid")]
        assert statuses == [RET_OK], (exits, caplog.text)
        assert sorted((index, code) for index, _, code in exits) == [(0, 0), (1, 0)]
        assert pool.killed == 0 and pool.restarts == 0
        handled = records(record_dir, "done")
        assert max(handled.values(), default=1) == 1  # nothing handled twice
        left = {m.id for m in pq.register_consumer("check", [TOPIC]).poll(10)}
        assert left == ids - set(handled)  # nothing lost
    finally:
        pq.close()


def _die_holding(lock: Any) -> None:
    lock.acquire()
    os._exit(0)  # killed while holding the stop gate's lock


def test_a_stop_gate_whose_lock_holder_died_neither_hangs_the_pool_nor_a_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fallback for a gate lock whose holder died wrote ``stopping.value``, which
    takes that same lock again: the supervisor hung forever (and a child arming later
    blocked in ``arm()`` for good)."""
    import multiprocessing

    from pawn_queue_sync.workers import common

    monkeypatch.setattr(common, "_GATE_TIMEOUT_S", 0.2)
    ctx = multiprocessing.get_context("spawn")
    stopping, armed = ctx.Value("b", 0), ctx.RawValue("b", 0)
    holder = ctx.Process(target=_die_holding, args=(stopping.get_lock(),))
    holder.start()
    holder.join(DEADLINE)
    assert holder.exitcode == 0
    results: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: results.update(
        stop=common.request_stop(stopping, [armed]), arm=common.arm(stopping, armed)),
        daemon=True)
    worker.start()
    worker.join(DEADLINE)
    assert not worker.is_alive(), "request_stop/arm hung on the dead holder's lock"
    assert results == {"stop": None, "arm": True}  # signal everyone; the child stops
    assert stopping.get_obj().value == 1 and armed.value == 1
