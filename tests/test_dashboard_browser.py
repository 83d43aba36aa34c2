"""``pawnq dashboard`` in a real headless browser (Debian's chromium, over the DevTools
Protocol: tests/browser.py) against SeaweedFS with real topics: the counts shown are the
bucket's; a redrive clicked in the page moves the dead letter and the counts follow;
bucket data is shown as text, never run; an action without the token, or from another
site's page, changes nothing; reloading pages makes no request to the bucket."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue
from tests.browser import Browser
from tests.dashboard_helpers import XSS, request, running, seed
from tests.fault_proxy import FaultProxy
from tests.servers import S3Server

pytestmark = pytest.mark.slow


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    with Browser(tmp_path / "profile") as b:
        yield b


def _shown(b: Browser, topic: str) -> dict[str, str]:
    """The cells of ``topic``'s row, by field."""
    cells = f"tr[data-topic=\"{topic}\"] td[data-field]"
    return b.eval(f"Object.fromEntries([...document.querySelectorAll('{cells}')]"
                  ".map(td => [td.dataset.field, td.textContent]))")


def _open_letters(b: Browser, topic: str, count: int) -> None:
    """Click ``topic``'s "dead letters" button, wait until ``count`` letters show."""
    b.wait_for(f"document.querySelector('button[data-open=\"{topic}\"]')")
    b.click(f'button[data-open="{topic}"]')
    b.wait_for(f"document.querySelectorAll('tr[data-key]').length === {count}")


def _visible(b: Browser, element_id: str) -> bool:
    """The element is laid out (not hidden, by its attribute or by CSS)."""
    return b.eval(f"document.getElementById('{element_id}').getClientRects().length > 0")


def _row_ready(topic: str, field: str, value: int) -> str:
    return (f"(document.querySelector('tr[data-topic=\"{topic}\"] td[data-field=\"{field}\"]')"
            f" || {{}}).textContent === '{value}'")


def test_counts_match_the_bucket_and_a_clicked_redrive_moves_the_letter(
        real_s3_config: dict[str, Any], browser: Browser) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        expected = seed(pq)
        with running(pq, actions=True) as dash:
            browser.goto(f"{dash.url}#token={dash.token}")
            browser.wait_for("document.querySelectorAll('tr[data-topic]').length === 2")
            for topic in ("orders", "events"):
                shown = _shown(browser, topic)
                bucket = pq.topic_stats(topic)
                for field, value in expected[topic].items():
                    assert shown[field] == str(value), (topic, field, shown)
                assert shown["pending"] == str(bucket["pending"])
                assert shown["dead_lettered"] == str(bucket["dead_letter"])
            assert _shown(browser, "events")["kind"] == "packed"
            assert browser.eval("location.hash") == ""  # the token left the address bar
            assert not _visible(browser, "token-form")  # ...for the tab's storage
            consumers = browser.eval(
                "[...document.querySelectorAll('#consumers tbody tr')].map(tr =>"
                " [tr.cells[0].textContent, tr.cells[3].textContent])")
            assert sorted(consumers) == [["audit", "alive"], ["billing", "alive"]]

            _open_letters(browser, "orders", 3)
            assert _visible(browser, "letter-actions")
            payloads = browser.eval("[...document.querySelectorAll('td[data-field=payload]')]"
                                    ".map(td => td.textContent).join(' ')")
            assert XSS.replace('"', '\\"') in payloads  # shown as text (JSON-escaped)...
            assert browser.eval("document.body.dataset.xss || window.xss || null") is None
            assert browser.eval("document.querySelectorAll('#letter-table img, "
                                "#letter-table script').length") == 0  # ...never run

            key = browser.eval("document.querySelector('tr[data-key]').dataset.key")
            moved = key.rsplit("/", 1)[1].removesuffix(".json")
            browser.click(f'button[data-redrive="{key}"]')
            browser.wait_for(_row_ready("orders", "dead_lettered", 2))
            browser.wait_for(_row_ready("orders", "pending", 3))
            browser.wait_for("document.querySelectorAll('tr[data-key]').length === 2")
            assert "1 moved back" in browser.eval(
                "document.getElementById('action-result').textContent")
            bucket = pq.topic_stats("orders")
            assert (bucket["pending"], bucket["dead_letter"]) == (3, 2)
            assert moved in {m.id for m in pq.peek("orders", n=10)}
            assert moved not in {d.id for d in pq.dead_letters("orders")}
            assert sorted([moved, *(d.id for d in pq.dead_letters("orders"))]) == \
                expected["nacked"]
            shot = os.environ.get("PAWNQ_DASHBOARD_SCREENSHOT")
            if shot:  # regenerate docs/dashboard.png (see docs/operations.md)
                browser.screenshot(Path(shot))


class _Attacker(BaseHTTPRequestHandler):
    """Another site's page (another origin) that tries to act on the dashboard."""

    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: Any) -> None:
        pass


def test_actions_without_the_token_or_from_another_site_change_nothing(
        real_s3_config: dict[str, Any], browser: Browser) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        seed(pq)
        with running(pq, actions=True) as dash:
            # the page opened without the token: the click is refused, the page says so
            browser.goto(dash.url)
            _open_letters(browser, "orders", 3)
            key = browser.eval("document.querySelector('tr[data-key]').dataset.key")
            browser.click(f'button[data-redrive="{key}"]')
            browser.wait_for("document.getElementById('action-result').textContent"
                             ".includes('refused')")
            assert "token" in browser.eval("document.getElementById('action-result').textContent")
            assert _visible(browser, "token-form")
            browser.click(f'button[data-purge="{key}"]')  # confirm() is accepted
            browser.wait_for("document.getElementById('action-result').textContent"
                             ".includes('purge refused')")

            # another site's page: a simple cross-site POST (no preflight), a fetch with
            # a guessed token header (preflight: never granted), a form posted at it
            target = dash.url + "api/purge"
            body = '{"topic": "orders", "all": true}'
            _Attacker.page = f"""<!doctype html><body><form id=f method=post
              enctype=text/plain action="{target}"><input name='{body[:-1]}'
              value='"}}'></form><script>
              const tries = [
                fetch("{target}", {{method: "POST", mode: "no-cors", body: '{body}',
                                   headers: {{"Content-Type": "text/plain"}}}}),
                fetch("{dash.url}api/redrive", {{method: "POST", body: '{body}',
                      headers: {{"Content-Type": "application/json",
                                 "X-Pawnq-Token": "guess-guess-guess-guess"}}}}),
              ];
              Promise.allSettled(tries).then(r => {{
                document.title = r.map(x => x.status).join(",");
              }});
            </script></body>""".encode()
            attacker = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
            threading.Thread(target=attacker.serve_forever, daemon=True).start()
            try:
                browser.goto(f"http://127.0.0.1:{attacker.server_address[1]}/")
                # the no-cors POST was sent (opaque answer), the preflighted one blocked
                assert browser.wait_for("document.title") == "fulfilled,rejected"
                browser.navigate_by(lambda: browser.eval("document.getElementById('f').submit()"))
                assert "cross-site request refused" in browser.eval("document.body.textContent")
            finally:
                attacker.shutdown()
                attacker.server_close()
        bucket = pq.topic_stats("orders")
        assert (bucket["pending"], bucket["dead_letter"]) == (2, 3)


def test_reloading_pages_makes_no_request_to_the_bucket(
        real_s3: S3Server, real_s3_config: dict[str, Any], browser: Browser) -> None:
    with PawnQueue.from_config(real_s3_config) as setup:
        seed(setup)
    with FaultProxy(real_s3.endpoint_url) as proxy:
        config = {**real_s3_config, "s3": {**real_s3_config["s3"],
                                           "endpoint_url": proxy.endpoint_url}}
        with PawnQueue.from_config(config) as pq, running(pq, interval=3600.0) as dash:
            polled = proxy.requests
            assert polled > 0 and dash.poller.polls == 1
            for _ in range(5):  # five reloads of the page
                browser.goto(dash.url)
                browser.wait_for("document.querySelectorAll('tr[data-topic]').length === 2")
            assert not _visible(browser, "token-form")  # read-only: nothing to act with
            # a hidden tab stops asking (the poller goes idle behind it), and asks again
            # as soon as it is shown
            browser.eval("""(async () => {
              window.stateReads = 0;
              const plain = window.fetch;
              window.fetch = (url, opts) => {
                if (String(url).includes('/api/state')) window.stateReads += 1;
                return plain(url, opts);
              };
              Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
              await refresh();
            })()""")
            assert browser.eval("[ui.paused, window.stateReads]") == [True, 1]
            browser.eval("Object.defineProperty(document, 'hidden', {configurable: true,"
                         " get: () => false}); document.dispatchEvent("
                         "new Event('visibilitychange'))")
            browser.wait_for("window.stateReads === 2 && ui.paused === false")
            with ThreadPoolExecutor(8) as pool:  # and 40 more readers at once
                answers = list(pool.map(lambda _: request(dash.url + "api/state"), range(40)))
            assert {status for status, _ in answers} == {200}
            assert proxy.requests == polled and dash.poller.polls == 1

            _open_letters(browser, "orders", 3)  # the dead letters: read once...
            assert not _visible(browser, "letter-actions")
            assert browser.eval("document.querySelectorAll('[data-redrive], [data-purge]')"
                                ".length") == 0
            letters = proxy.requests
            assert letters > polled and dash.poller.letter_fetches == 1
            with ThreadPoolExecutor(8) as pool:  # ...for every page in the interval
                answers = list(pool.map(
                    lambda _: request(dash.url + "api/dead-letters?topic=orders"), range(40)))
            assert {len(doc["letters"]) for _, doc in answers} == {3}
            browser.goto(dash.url)
            _open_letters(browser, "orders", 3)
            assert proxy.requests == letters and dash.poller.letter_fetches == 1
            assert dash.poller.polls == 1


def test_beyond_loopback_the_page_asks_for_the_token_before_showing_anything(
        real_s3_config: dict[str, Any], browser: Browser) -> None:
    token = "a-token-the-user-chose-0123456789"
    with PawnQueue.from_config(real_s3_config) as pq:
        seed(pq)
        with running(pq, host="0.0.0.0", token=token) as dash:
            browser.goto(f"http://127.0.0.1:{dash.httpd.server_address[1]}/")
            browser.wait_for("document.getElementById('error').textContent.includes('401')"
                             " || document.getElementById('error').textContent"
                             ".includes('token')")
            assert _visible(browser, "token-form")
            assert browser.eval("document.querySelectorAll('tr[data-topic]').length") == 0
            browser.type_text("#token-input", token)
            browser.click("#token-form button")
            browser.wait_for("document.querySelectorAll('tr[data-topic]').length === 2")
            assert _shown(browser, "orders")["dead_lettered"] == "3"
            assert not _visible(browser, "token-form") and not _visible(browser, "error")
