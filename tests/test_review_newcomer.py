"""Review 16B (a newcomer ran every example literally): what the CLI and the errors
told them, as a user meets it.

- ``pawnq topics --delete`` of a topic that is not empty named the library's
  ``delete_topic(..., force=True)``, not the CLI's ``--force``;
- the ConfigError for a ``max_delay_seconds`` just over the 10-year ceiling printed the
  rejected value with ``:g`` (``got 3.1536e+08``): it looked equal to the bound;
- ``pawnq peek`` of an empty topic was headed "orders: 0 oldest pending";
- the dashboard's ``Server:`` header ended in a space (an empty ``sys_version``);
- ``pawnq worker`` printed nothing at start (not where its metrics are served) and
  nothing on a graceful stop;
- a ``config.yaml`` in the working directory is read only with ``--config``: a
  command run without it worked on the local store in ``./.pawnqueue`` silently.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pawn_queue_sync import load_config
from pawn_queue_sync.cli import EXIT_ERROR, EXIT_OK, main
from pawn_queue_sync.config.schema import (
    MAX_DELAY_CEILING_SECONDS,
    MIN_VISIBILITY_TIMEOUT_SECONDS,
)
from pawn_queue_sync.errors import ConfigError
from pawn_queue_sync.testing import memory_queue

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no configuration: the CLI uses ``./.pawnqueue``."""
    for name in list(os.environ):
        if name.startswith(("PAWNQUEUE_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_topics_delete_refused_names_the_cli_flag(
    local_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topics", "--create", "orders"]) == EXIT_OK
    assert main(["publish", "orders", '{"n": 1}']) == EXIT_OK
    capsys.readouterr()
    assert main(["topics", "--delete", "orders"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "TopicNotEmptyError" in err and "'orders' is not empty" in err, err
    assert "pawnq topics --delete orders --force" in err, err
    assert "delete_topic(" not in err, err
    assert main(["topics", "--delete", "orders", "--force"]) == EXIT_OK


def test_config_errors_print_the_rejected_value_so_it_differs_from_the_bound() -> None:
    over = MAX_DELAY_CEILING_SECONDS + 1
    with pytest.raises(ConfigError) as delay:
        load_config({"publishing": {"max_delay_seconds": over}})
    assert "315360001" in str(delay.value), str(delay.value)
    assert "<= 315360000 " in str(delay.value), str(delay.value)
    short = MIN_VISIBILITY_TIMEOUT_SECONDS - 1e-6
    with pytest.raises(ConfigError) as timeout:
        load_config({"polling": {"visibility_timeout_seconds": short}})
    assert f"got {short!r}" in str(timeout.value), str(timeout.value)


def test_peek_of_an_empty_topic_says_nothing_is_pending(
    local_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topics", "--create", "orders"]) == EXIT_OK
    capsys.readouterr()
    assert main(["peek", "orders"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "orders: nothing pending" in out, out
    assert "0 oldest" not in out, out
    assert main(["publish", "orders", '{"n": 1}', '{"n": 2}']) == EXIT_OK
    capsys.readouterr()
    assert main(["peek", "orders"]) == EXIT_OK
    assert "orders: 2 oldest pending" in capsys.readouterr().out


def test_the_dashboard_server_header_has_no_trailing_space() -> None:
    from pawn_queue_sync.dashboard import Dashboard

    pq = memory_queue(topics=["orders"])
    try:
        with Dashboard(pq, port=0) as dash, urllib.request.urlopen(
                dash.url + "api/state", timeout=30) as answer:
            assert answer.headers["Server"] == "pawnq-dashboard"
    finally:
        pq.close()


class _Lines:
    """The lines a process writes, read on a thread as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(target=lambda: [self.lines.put(x) for x in stream], daemon=True).start()

    def until(self, text: str, timeout: float = 120.0) -> list[str]:
        """Every line read until one holding ``text`` (the test fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            try:
                self.seen.append(self.lines.get(timeout=max(deadline - time.monotonic(), 0)))
            except queue.Empty:
                pytest.fail(f"no line with {text!r} in {timeout} s: {self.seen}")
        return self.seen


def handle(msg: object) -> None:
    """The worker's handler (nothing to do)."""


def test_pawnq_worker_says_where_its_metrics_are_and_that_it_stopped(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items()
           if k != "PROMETHEUS_MULTIPROC_DIR" and not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env["PAWNQUEUE_LOCAL_PATH"] = str(tmp_path / "store")
    created = subprocess.run(
        [sys.executable, "-m", "pawn_queue_sync", "topics", "--create", "orders"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    # -v: the supervisor logs "started worker 0" once its signal handlers are in place
    proc = subprocess.Popen(
        [sys.executable, "-m", "pawn_queue_sync", "-v", "worker",
         "tests.test_review_newcomer:handle", "--topic", "orders", "--processes", "1",
         "--threads", "1", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = _Lines(proc)
    try:
        seen = lines.until("started worker 0")
        start = [line for line in seen if line.startswith("pawnq worker: starting")]
        assert len(start) == 1, seen
        assert f"metrics at http://127.0.0.1:{port}/metrics" in start[0], start
        assert "tests.test_review_newcomer:handle on orders" in start[0], start
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert proc.returncode == 0, lines.seen
    assert lines.until("pawnq worker: stopped")[-1] == "pawnq worker: stopped\n"


def _s3_config_yaml(directory: Path) -> None:
    (directory / "config.yaml").write_text(yaml.safe_dump({"s3": {
        "endpoint_url": "http://127.0.0.1:9", "bucket_name": "b",
        "aws_access_key_id": "k", "aws_secret_access_key": "s"}}))


def test_a_config_yaml_not_passed_is_named_when_the_local_store_is_used(
    local_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topics", "--create", "orders"]) == EXIT_OK
    assert capsys.readouterr().err == ""  # no config.yaml here: nothing to say
    _s3_config_yaml(local_dir)
    assert main(["topics", "--create", "orders"]) == EXIT_OK
    err = capsys.readouterr().err
    assert "local store" in err and ".pawnqueue" in err, err
    assert "--config config.yaml" in err, err
