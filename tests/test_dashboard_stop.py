"""Stopping ``pawnq dashboard`` (review 16B, R3): ``Dashboard.stop()`` and Ctrl-C do not
wait for a poll stuck on a hanging bucket; that poll's result is dropped and nothing
polls the queue after it is closed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.dashboard import Dashboard
from tests.dashboard_helpers import request, seed
from tests.relay import Relay
from tests.servers import config_dict

ROOT = Path(__file__).resolve().parents[1]
PAWNQ = [sys.executable, "-m", "pawn_queue_sync"]


@pytest.fixture
def local(tmp_path: Path) -> dict[str, Any]:
    return {"local": {"path": str(tmp_path / "store")}}




def test_stop_does_not_wait_for_a_hung_poll_and_drops_its_result(
        local: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """A poll stuck on a slow bucket (default: read timeout 30 s x 5 attempts per
    request): Dashboard.stop() waited 60 s for it, then returned with the poller still
    running, which logged a failure of the closed queue and would poll it again. Now
    stop returns while the poll hangs; when the poll ends (here: raising, as on a
    closed queue) its result is dropped, nothing is logged, and no poll follows."""
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        hang = threading.Event()
        release = threading.Event()
        calls: list[int] = []

        def stuck(*a: Any, **k: Any) -> Any:
            calls.append(1)
            hang.set()
            release.wait(600)
            raise RuntimeError("the queue was closed under this poll")

        dash = Dashboard(pq, port=0, interval=2.0).start()
        assert dash.poller.wait_for_polls(1)
        polls = dash.poller.polls
        pq.stats_all = stuck  # type: ignore[method-assign]
        dash.poller.refresh(timeout=0.01)
        assert hang.wait(30)
        stopped = threading.Event()
        threading.Thread(target=lambda: (dash.stop(), stopped.set()), daemon=True).start()
        returned = stopped.wait(30)  # the poll hangs until release: stop must not wait
        release.set()
        thread = dash.poller._thread
        assert thread is not None
        thread.join(30)
        ended = not thread.is_alive()
    assert returned, "stop() waited for the hung poll"
    assert ended and calls == [1] and dash.poller.polls == polls
    assert "dashboard poll failed" not in caplog.text


def test_ctrl_c_stops_pawnq_dashboard_promptly_when_the_bucket_hangs(
        real_s3: Any, real_bucket: str, tmp_path: Path) -> None:
    stall = Relay(real_s3.endpoint_url)
    cfg = config_dict(real_s3, real_bucket, s3={"endpoint_url": stall.endpoint_url})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQ")}
    env["PYTHONPATH"] = str(ROOT)
    subprocess.run([*PAWNQ, "--config", "c.yaml", "topics", "--create", "orders"],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    proc = subprocess.Popen([*PAWNQ, "--config", "c.yaml", "dashboard", "--port", "0",
                             "--interval", "2"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
        url = first.split(": ", 1)[1].split(" ", 1)[0]
        stall.freeze()  # the bucket stops answering
        assert request(url + "api/state")[0] == 200  # a page looks: the poller polls on
        assert stall.swallowed.wait(60), "no poll reached the frozen bucket"
        proc.send_signal(signal.SIGINT)  # while that poll hangs
        t0 = time.monotonic()
        try:
            proc.wait(timeout=180)
        finally:
            took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
        stall.stop()
    # the bound docs/operations.md states: stopping never waits for a poll on the bucket
    assert took < 20, f"Ctrl-C took {took:.0f} s to stop pawnq dashboard; rc={proc.returncode}"
    assert proc.returncode == 0 and "poll failed" not in err, err
