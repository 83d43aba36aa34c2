"""Review 16B (R3)'s attacks on ``pawnq dashboard``, kept as regression tests: a refused
POST's body never becomes a next request (stopping: test_dashboard_stop.py), another
site's page cannot make the server read the bucket, idle connections
time out, a run of actions shares one poll, a non-ASCII token is refused at start, and a
poll's error reaches the page scrubbed."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.dashboard import Dashboard
from tests.dashboard_helpers import post_action, request, running, seed

ROOT = Path(__file__).resolve().parents[1]
PAWNQ = [sys.executable, "-m", "pawn_queue_sync"]


@pytest.fixture
def local(tmp_path: Path) -> dict[str, Any]:
    return {"local": {"path": str(tmp_path / "store")}}


def _raw(port: int, data: bytes, wait_for: int = 1, timeout: float = 5.0) -> bytes:
    """Send raw bytes, read until ``wait_for`` HTTP status lines came back (or timeout)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    s.sendall(data)
    got = b""
    try:
        while got.count(b"HTTP/1.1 ") < wait_for:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except TimeoutError:
        pass
    s.close()
    return got


def _after_the_answer(answer: bytes) -> bytes:
    """What the server sent after its first answer (its headers and Content-Length
    bytes): a second answer, or an error page for the body read as a request line."""
    head, _, rest = answer.partition(b"\r\n\r\n")
    found = re.search(rb"(?i)content-length: *(\d+)", head)
    assert found, answer
    return rest[int(found.group(1)):]


def test_a_refused_post_body_is_not_parsed_as_a_second_request(local: dict[str, Any]) -> None:
    """A cross-site text/plain form POST is refused (403) but its body is left unread on
    the kept-alive connection: the server then parses the body as the next request
    (request smuggling / desync), which carries no Origin and no Sec-Fetch-Site."""
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq, actions=True) as dash:
            port = dash.httpd.server_address[1]
            smuggled = (f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        "\r\n").encode()
            head = (f"POST /api/redrive HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    "Origin: http://evil.example\r\nSec-Fetch-Site: cross-site\r\n"
                    "Content-Type: text/plain\r\n"
                    f"Content-Length: {len(smuggled)}\r\n\r\n").encode()
            answer = _raw(port, head + smuggled, wait_for=2)
    # a status line right after the 403's JSON body: the smuggled GET was answered
    assert _after_the_answer(answer) == b"" and b'"topics"' not in answer, answer[-400:]


def _closed_by_server(socks: list[socket.socket], seconds: float = 20.0) -> list[bool]:
    """Which of ``socks`` the server closed within ``seconds`` (one deadline for all)."""
    deadline = time.monotonic() + seconds
    closed = []
    for sock in socks:
        try:
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                if not sock.recv(65536):
                    break
            closed.append(True)
        except TimeoutError:
            closed.append(False)
        except OSError:  # reset by the server: closed too
            closed.append(True)
    return closed


def test_idle_connections_are_closed_by_the_server(
        local: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Slowloris: a connection that sends nothing, or a POST that sends less than its
    Content-Length, held a server thread forever (no timeout). With a request timeout
    (1 s here) the server closes both, and the threads end."""
    from pawn_queue_sync.dashboard import server
    monkeypatch.setattr(server, "REQUEST_TIMEOUT", 1.0, raising=False)
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq, actions=True) as dash:
            port = dash.httpd.server_address[1]
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
            short = socket.create_connection(("127.0.0.1", port))
            short.sendall((f"POST /api/purge HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           f"Origin: http://127.0.0.1:{port}\r\n"
                           "Content-Type: application/json\r\n"
                           f"X-Pawnq-Token: {dash.token}\r\n"
                           "Content-Length: 100\r\n\r\n{\"topic\"").encode())
            try:
                closed = _closed_by_server([*idle, short])
            finally:
                for s in [*idle, short]:
                    s.close()
            assert request(dash.url + "api/state")[0] == 200  # still serving
    assert all(closed), f"{closed.count(False)} of {len(closed)} connections left open"


def test_a_cross_site_get_does_not_make_the_dashboard_read_the_bucket(
        local: dict[str, Any]) -> None:
    """Any web page the operator has open can embed <img src=http://127.0.0.1:8710/api/
    dead-letters?topic=orders>: the Host is right, GETs ignore Sec-Fetch-Site, so the
    request wakes the poller and fetches the dead letters (a LIST and a GET each) - from
    another site, without the operator looking at the dashboard."""
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq) as dash:
            evil = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
                    "Sec-Fetch-Dest": "image", "Referer": "http://evil.example/"}
            s1, _ = request(dash.url + "api/dead-letters?topic=orders", headers=evil)
            s2, _ = request(dash.url + "api/state", headers=evil)
            s3, _ = request(dash.url + "api/state",
                            headers={"Origin": "http://evil.example"})
            fetched = dash.poller.letter_fetches
            # a browser's own page (same-origin) and a client sending no Sec-Fetch-*
            # header (curl, scripts) are answered
            own, _ = request(dash.url + "api/state", headers={"Sec-Fetch-Site": "same-origin"})
            typed, _ = request(dash.url + "api/state", headers={"Sec-Fetch-Site": "none"})
            plain, _ = request(dash.url + "api/dead-letters?topic=orders")
    assert (s1, s2, s3, fetched) == (403, 403, 403, 0)
    assert (own, typed, plain) == (200, 200, 200)


def test_a_run_of_actions_shares_one_poll(local: dict[str, Any]) -> None:
    """Every action forced a full poll (stats_all of every topic) at once: 10 actions in
    a row were 10 full polls. Now they share one, at most one per MIN_INTERVAL (the
    clock is manual: time moves only here), and that poll shows their effect."""
    from pawn_queue_sync.clock import FakeClock
    from pawn_queue_sync.dashboard.poller import MIN_INTERVAL
    clock = FakeClock()
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        letters = list(pq.dead_letters("orders"))
        with running(pq, actions=True, interval=300.0, clock=clock) as dash:
            first = dash.poller.polls
            for i in range(10):
                letter = letters[i] if i < 2 else None
                picked = ({letter.key: letter.etag} if letter is not None
                          else {"orders/dead-letter/none.json": ""})
                status, _ = post_action(dash, "purge", {"topic": "orders", "letters": picked},
                                        dash.token)
                assert status == 200
            during = dash.poller.polls - first
            clock.advance(MIN_INTERVAL)  # the shared poll is due
            assert dash.poller.wait_for_polls(first + 1)
            clock.advance(MIN_INTERVAL)  # and no other is
            state = dash.poller.snapshot()
            polls = dash.poller.polls - first
        clock.close()
    assert (during, polls) == (0, 1), f"{during} polls during, {polls} in all"
    [orders] = [t for t in state["topics"] if t["topic"] == "orders"]
    assert orders["dead_lettered"] == 1


NON_ASCII_TOKEN = "clé-secrète-0123456789"


def test_a_non_ascii_token_is_refused_at_start(tmp_path: Path) -> None:
    """The CLI accepted any token of 16+ characters; a non-ASCII one could never match
    (http.server decodes headers as latin-1, the page's fetch() refuses non-latin-1
    header values): a usage error now (exit 2), before the store is opened."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQ")}
    env.update(PYTHONPATH=str(ROOT), PAWNQ_DASHBOARD_TOKEN=NON_ASCII_TOKEN)
    try:
        done = subprocess.run([*PAWNQ, "dashboard", "--port", "0", "--allow-actions"],
                              cwd=tmp_path, env=env, text=True, capture_output=True,
                              timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("pawnq dashboard started with a non-ASCII token")
    assert done.returncode == 2 and "ASCII" in done.stderr, done.stderr
    assert NON_ASCII_TOKEN not in done.stderr
    (tmp_path / "token").write_text("tab\tinside-the-token-0123\n")
    done = subprocess.run([*PAWNQ, "dashboard", "--port", "0", "--token-file", "token"],
                          cwd=tmp_path, env={**env, "PAWNQ_DASHBOARD_TOKEN": ""}, text=True,
                          capture_output=True, timeout=30)
    assert done.returncode == 2 and "ASCII" in done.stderr, done.stderr
    assert not (tmp_path / ".pawnqueue").exists()


def test_the_library_refuses_a_non_ascii_token(local: dict[str, Any]) -> None:
    from pawn_queue_sync.errors import InvalidArgument
    with PawnQueue.from_config(local) as pq, pytest.raises(InvalidArgument,
                                                          match="ASCII") as caught:
        Dashboard(pq, port=0, actions=True, token=NON_ASCII_TOKEN)
    assert NON_ASCII_TOKEN not in str(caught.value)


def test_a_keep_alive_client_gets_the_answer_to_its_own_request(local: dict[str, Any]) -> None:
    """The same desync seen by an honest client (http.client / requests.Session keep the
    connection): a POST refused for a wrong token (403) leaves its JSON body unread; the
    server parses that body as a request line and queues a 400 for it; the client's next
    POST, with the right token, reads that 400 and is never executed."""
    import http.client
    import json as _json
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        letter = next(iter(pq.dead_letters("orders")))
        with running(pq, actions=True) as dash:
            port = dash.httpd.server_address[1]
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            body = _json.dumps({"topic": "orders", "keys": [letter.key]})
            headers = {"Content-Type": "application/json",
                       "Origin": f"http://127.0.0.1:{port}"}
            conn.request("POST", "/api/redrive", body, {**headers, "X-Pawnq-Token": "wrong"})
            first = conn.getresponse()
            first.read()
            conn.request("POST", "/api/redrive", body, {**headers, "X-Pawnq-Token": dash.token})
            second = conn.getresponse()
            answer = second.read()
            conn.close()
            left = [d.key for d in pq.dead_letters("orders")]
    assert (first.status, second.status) == (403, 200), answer[:300]
    assert letter.key not in left


def test_a_chunked_post_body_is_not_parsed_as_a_second_request(
        local: dict[str, Any]) -> None:
    """A chunked POST (no Content-Length) was refused (413) with its chunks left on the
    kept-alive connection, read as the next request."""
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq, actions=True) as dash:
            port = dash.httpd.server_address[1]
            smuggled = f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
            head = (f"POST /api/redrive HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Origin: http://127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                    f"X-Pawnq-Token: {dash.token}\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n").encode()
            chunks = b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n"
            answer = _raw(port, head + chunks, wait_for=2)
    assert _after_the_answer(answer) == b"" and b'"topics"' not in answer, answer[-400:]
    assert b"Connection: close" in answer


def test_a_polls_error_reaches_the_page_scrubbed(
        local: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """The poller showed ``f"{type}: {exc}"`` of any exception: a third-party error whose
    text holds a credential put it on the page (and in the log). Now the page and the
    log get the type and a safe message, never the exception's text."""
    from tests.servers import LEAK_CHECK_SECRET_KEY

    def leaky(*a: Any, **k: Any) -> Any:
        raise RuntimeError(f"signing failed for secret {LEAK_CHECK_SECRET_KEY}")

    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq, actions=True) as dash:
            pq.stats_all = leaky  # type: ignore[method-assign]
            pq.dead_letters = leaky  # type: ignore[method-assign]
            dash.poller.refresh()
            status, state = request(dash.url + "api/state")
            s2, letters = request(dash.url + "api/dead-letters?topic=orders")
    assert status == 200 and "RuntimeError" in state["error"], state["error"]
    assert s2 == 500 and "RuntimeError" in letters["error"], letters
    for text in (str(state), str(letters), caplog.text):
        assert LEAK_CHECK_SECRET_KEY not in text and "signing failed" not in text


def test_private_reads_need_the_token_on_loopback(local: dict[str, Any]) -> None:
    """On loopback reads need no token: any user of the machine reads every payload.
    ``private`` (``--private``) makes them need it there too; the page is still served
    (it holds no data and asks for the token)."""
    from pawn_queue_sync.dashboard import TOKEN_HEADER
    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq) as open_to_all:
            assert request(open_to_all.url + "api/state")[0] == 200
        with running(pq, private=True) as dash:
            assert dash.token is not None and not dash.guard.actions
            page, _ = request(dash.url)
            bare = [request(dash.url + path)[0]
                    for path in ("api/state", "api/dead-letters?topic=orders")]
            wrong = request(dash.url + "api/state", headers={TOKEN_HEADER: "x" * 43})[0]
            status, state = request(dash.url + "api/state", headers={TOKEN_HEADER: dash.token})
            fetched = dash.poller.letter_fetches
    assert (page, bare, wrong, fetched) == (200, [401, 401], 401, 0)
    assert status == 200 and state["reads_need_token"] and state["topics"]


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    from tests.browser import Browser
    with Browser(tmp_path / "profile") as b:
        yield b


def test_browser_another_sites_images_do_not_read_the_bucket(
        local: dict[str, Any], browser: Any) -> None:
    """A page on another site (http://localhost:P2, the dashboard is on 127.0.0.1:P1)
    with <img src=.../api/dead-letters?topic=orders>: the dashboard fetches the dead
    letters for it (a LIST and a GET per letter), and keeps the poller awake."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    with PawnQueue.from_config(local) as pq:
        seed(pq)
        with running(pq) as dash:
            before = dash.poller.letter_fetches
            page = (f'<!doctype html><img src="{dash.url}api/dead-letters?topic=orders">'
                    f'<img src="{dash.url}api/state">').encode()

            class Evil(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)

                def log_message(self, *a: Any) -> None:
                    pass

            evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
            threading.Thread(target=evil.serve_forever, daemon=True).start()
            try:
                browser.goto(f"http://localhost:{evil.server_address[1]}/")
                browser.wait_for("document.readyState === 'complete'")
            finally:
                evil.shutdown()
                evil.server_close()
            fetched = dash.poller.letter_fetches - before
    assert fetched == 0, f"another site's page made the dashboard fetch dead letters {fetched}x"


def test_browser_names_and_reasons_are_text(local: dict[str, Any], browser: Any) -> None:
    """A consumer name and a nack reason carrying HTML: shown as text, never run."""
    x = "<img src=x onerror=\"document.body.dataset.xss='ran'\"><b id=injected>b</b>"
    with PawnQueue.from_config(local) as pq:
        pq.create_topic("t")
        pq.register_producer("p").publish("t", {"p": x})
        c = pq.register_consumer(x, ["t"])
        [m] = c.poll(1)
        m.nack(x)
        with running(pq, actions=True) as dash:
            browser.goto(f"{dash.url}#token={dash.token}")
            browser.wait_for("document.querySelectorAll('#consumers tbody tr').length === 1")
            browser.click('button[data-open="t"]')
            browser.wait_for("document.querySelectorAll('tr[data-key]').length === 1")
            shown = browser.eval("[document.querySelector('#consumers tbody td').textContent,"
                                 " document.querySelector('td[data-field=reason]').textContent,"
                                 " document.body.dataset.xss || null,"
                                 " document.getElementById('injected') === null]")
    assert shown == [x, x, None, True], shown
