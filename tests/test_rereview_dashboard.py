"""Re-review RR2 of the dashboard: a stopped dashboard serves nothing on kept-alive
connections, a trickling request is cut off at a deadline, connections are capped, and
a dead-letter listing begun before an action is not served after it."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.dashboard import Dashboard, server
from pawn_queue_sync.dashboard.poller import Poller
from pawn_queue_sync.dashboard.source import Reading
from tests.dashboard_helpers import running, seed


@pytest.fixture
def local(tmp_path: Path) -> dict[str, Any]:
    return {"local": {"path": str(tmp_path / "store")}}


def _ask(s: socket.socket, port: int, method: str, path: str, body: bytes = b"",
         extra: str = "") -> bytes:
    s.sendall((f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += s.recv(65536)
    return head + b"\r\n\r\n" + rest


def test_a_stopped_dashboard_runs_no_action(local: dict[str, Any]) -> None:
    """A kept-alive connection opened before stop() sends a redrive-all with the token
    after it: before the fix the handler thread served it and moved the 3 letters."""
    with PawnQueue.from_config(local) as pq:
        seed(pq)  # orders: 3 dead letters
        dash = Dashboard(pq, port=0, actions=True).start()
        assert dash.poller.wait_for_polls(1)
        port = dash.httpd.server_address[1]
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        assert _ask(s, port, "GET", "/api/state").startswith(b"HTTP/1.1 200")
        dash.stop()
        body = json.dumps({"topic": "orders", "all": True}).encode()
        try:
            answer = _ask(s, port, "POST", "/api/redrive", body,
                          f"Origin: http://127.0.0.1:{port}\r\n"
                          f"Content-Type: application/json\r\nX-Pawnq-Token: {dash.token}\r\n")
        except OSError:
            answer = b""
        finally:
            s.close()
        left = pq.stats("orders").dead_lettered
    assert left == 3 and (answer == b"" or answer.startswith(b"HTTP/1.1 503")), (
        f"served after stop() ({left} dead letters left of 3): {answer[-120:]!r}")


def test_a_request_after_stop_is_refused_with_503(local: dict[str, Any]) -> None:
    """The handler's own check, whatever stop() did to the socket: a request that
    reaches a handler of a stopped dashboard gets 503 and Connection: close."""
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        dash = Dashboard(pq, port=0, actions=True).start()
        assert dash.poller.wait_for_polls(1)
        port = dash.httpd.server_address[1]
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        try:
            assert _ask(s, port, "GET", "/api/state").startswith(b"HTTP/1.1 200")
            dash.stopping.set()  # as stop() does first, before the sockets are shut
            answer = _ask(s, port, "GET", "/api/state")
            assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
            assert b"connection: close" in answer.lower()
            assert s.recv(1024) == b""  # and the connection is closed
        finally:
            s.close()
            dash.stop()


def _trickle(port: int, seconds: float) -> float | None:
    """Send a header byte every 0.3 s; the time the server cut it off, or None."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            time.sleep(0.3)
            try:
                s.sendall(b"a")
            except OSError:
                return time.monotonic() - started
            s.setblocking(False)
            try:
                s.recv(1024)  # an answer or EOF: cut off
                return time.monotonic() - started
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
    finally:
        s.close()
    return None


def test_a_trickling_request_is_cut_off(local: dict[str, Any],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.3 s with REQUEST_TIMEOUT 1 s: a per-recv timeout never fires, so
    before the fix the handler thread was held for the whole 8 s (and for ever)."""
    monkeypatch.setattr(server, "REQUEST_TIMEOUT", 1.0)
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq) as dash:
            closed_after = _trickle(dash.httpd.server_address[1], 8.0)
    assert closed_after is not None, (
        "the server still waits for the headers after 8 s of a byte every 0.3 s "
        "(REQUEST_TIMEOUT 1 s): its handler thread is held as long as the client likes")


def test_control_silence_is_cut_off(local: dict[str, Any],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the patched REQUEST_TIMEOUT is in force (silence IS cut off)."""
    monkeypatch.setattr(server, "REQUEST_TIMEOUT", 1.0)
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq) as dash:
            port = dash.httpd.server_address[1]
            s = socket.create_connection(("127.0.0.1", port))
            s.settimeout(5.0)
            s.sendall(f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
            try:
                assert s.recv(1024) == b""  # EOF within ~1 s of silence
            finally:
                s.close()


def test_connections_beyond_the_cap_are_refused(local: dict[str, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_CONNECTIONS open (idle) connections hold their threads; the next one gets
    503 + close at once, and once one of them closes a new one is served again.
    Before the fix there was no cap: the extra connection got no answer until it
    sent a request, and then a 200."""
    monkeypatch.setattr(server, "MAX_CONNECTIONS", 2)
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq) as dash:
            port = dash.httpd.server_address[1]
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
            try:
                for s in held:  # each is served once: its handler thread runs
                    s.settimeout(5)
                    assert _ask(s, port, "GET", "/api/state").startswith(b"HTTP/1.1 200")
                extra = socket.create_connection(("127.0.0.1", port))
                extra.settimeout(5)
                try:  # answered at once, before any request: no thread reads it
                    answer = b""
                    while chunk := extra.recv(65536):
                        answer += chunk
                except OSError:
                    pass
                finally:
                    extra.close()
                assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
                assert b"connection: close" in answer.lower()
                held.pop().close()
                assert dash.httpd.wait_open_below(2, timeout=5)
                again = socket.create_connection(("127.0.0.1", port))
                again.settimeout(5)
                try:
                    assert _ask(again, port, "GET", "/api/state").startswith(b"HTTP/1.1 200")
                finally:
                    again.close()
            finally:
                for s in held:
                    s.close()


def test_letters_listed_before_an_action_are_not_served_after_it() -> None:
    """A dead-letter LIST that began before an action and ends after its
    request_poll(): before the fix its pre-action answer was cached and served."""
    bucket = {"letters": [{"key": "dl/1"}, {"key": "dl/2"}]}
    listing, release = threading.Event(), threading.Event()

    def letters(topic: str) -> list[dict[str, Any]]:
        seen = list(bucket["letters"])  # the LIST happens here...
        if not listing.is_set():
            listing.set()
            release.wait(10)  # ...and its answer is slow to come back
        return seen

    clock = FakeClock()
    poller = Poller(lambda: Reading([], [], None), 5.0, letters=letters, clock=clock)
    page_a: list[list[dict[str, Any]]] = []
    fetch = threading.Thread(target=lambda: page_a.append(poller.dead_letters("t")))
    fetch.start()  # page A's periodic refresh
    assert listing.wait(5)
    bucket["letters"] = []  # the user's redrive-all moves both letters...
    poller.request_poll()  # ...and the action's answer clears the cache
    release.set()
    fetch.join(5)
    clock.advance(1.0)  # within the interval
    after = poller.dead_letters("t")  # page B (or A's next refresh), after the action
    assert after == [], f"letters the action moved still served: {after}"
