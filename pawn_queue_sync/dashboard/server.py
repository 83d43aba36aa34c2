"""``pawnq dashboard``'s web server: the standard library's ``ThreadingHTTPServer``.

Routes: ``GET /`` (the page, ``dashboard.js``, ``dashboard.css``: package data, no
CDN), ``GET /api/state`` (the poller's last reading, from memory), ``GET
/api/dead-letters?topic=T`` (the first dead letters of a topic, fetched at most once
per poll interval), and, with ``--allow-actions`` and the token only, ``POST
/api/redrive`` and ``POST /api/purge`` (JSON: ``{"topic": T, "keys": [...]}`` or
``{"topic": T, "all": true}``; purge takes ``"letters": {key: etag}``). Every check is
in :mod:`.security`. A request whose body is not read (refused, chunked, cut short)
gets ``Connection: close``, so its bytes are never read as a next request. Each
request (its line, headers and body) must arrive within :data:`REQUEST_TIMEOUT` seconds
of the connection's start or previous answer, however it trickles, else the connection
is closed; at most :data:`MAX_CONNECTIONS` are open at once, the next get a 503 and are
closed (:mod:`.httpd`). After :meth:`Dashboard.stop` nothing is served: a request
that reaches a handler gets a 503 and ``Connection: close``, and the open connections
are shut down.
Why the standard library: a page, four JSON routes and a few
requests a second need nothing more, and the wheel gains no dependency.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import InvalidArgument, PawnQueueError, TopicNotFoundError
from ..queue import deadletter_picks
from ..queue.core import PawnQueue
from .httpd import TrackedServer, TrackedServerV6
from .poller import IDLE_AFTER, Poller
from .security import Guard, check_token, is_loopback, logged_error, new_token, public_error
from .source import LETTERS_SHOWN, read_dead_letters, read_stats

log = logging.getLogger(__name__)

__all__ = ["Dashboard"]

_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/index.html": ("index.html", "text/html; charset=utf-8"),
           "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
           "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: The largest POST body read (a selection of 1,000 keys with their ETags fits).
MAX_BODY = 1 << 20
#: Seconds a connection has to send a whole request (line, headers, body), from its
#: start or the previous answer, before the server closes it: an idle, slow or
#: trickling client does not hold a thread for ever.
REQUEST_TIMEOUT = 30.0
#: Connections open at once at most (a thread each); the next get a 503 and are closed.
#: A browser tab keeps up to 6 open.
MAX_CONNECTIONS = 32


class Dashboard:
    """The server and its poller over a started ``pq``. ``token``: the user's; with
    ``actions`` or ``private`` and none, one is made (:attr:`token`). Binding beyond
    loopback without a token is refused (InvalidArgument): there, reads need it too;
    ``private``: on loopback as well (another user of the machine cannot read)."""

    def __init__(self, pq: PawnQueue, *, host: str = "127.0.0.1", port: int = 8710,
                 interval: float = 5.0, actions: bool = False, token: str | None = None,
                 allowed_hosts: Iterable[str] = (), clock: Clock = SYSTEM_CLOCK,
                 idle_after: float = IDLE_AFTER, private: bool = False) -> None:
        if not is_loopback(host) and token is None:
            raise InvalidArgument(
                f"binding to {host} (beyond loopback) needs a token you set "
                "(PAWNQ_DASHBOARD_TOKEN or --token-file): every request must carry it")
        if token is not None:
            check_token(token)
        if (actions or private) and token is None:
            token = new_token()
        self.pq = pq
        self.token = token
        self.poller = Poller(lambda: read_stats(pq), interval,
                             letters=lambda topic: read_dead_letters(pq, topic),
                             clock=clock, idle_after=idle_after)
        #: Set by :meth:`stop`: every handler refuses from then on.
        self.stopping = threading.Event()
        server_class = TrackedServerV6 if ":" in host.strip("[]") else TrackedServer
        self.httpd = server_class((host.strip("[]"), port), _handler(self))
        self.httpd.request_timeout = REQUEST_TIMEOUT
        self.httpd.max_connections = MAX_CONNECTIONS
        bound_port = self.httpd.server_address[1]
        self.guard = Guard.build(host, bound_port, token, actions, allowed_hosts, private)
        self.store = pq.store.describe()
        self.actions_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def start(self) -> Dashboard:
        self.poller.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="pawnq-dashboard-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and polling, without waiting for a poll under way (see
        :meth:`Poller.stop`): at most about a second, however the bucket behaves.
        Kept-alive connections are shut down too, and a request already read gets a
        503: no action runs after this returns."""
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.close_connections()
        self.httpd.server_close()
        self.poller.stop()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the routes do ---------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {**self.poller.snapshot(), "store": self.store, "actions": self.guard.actions,
                "reads_need_token": self.guard.reads_need_token,
                "letters_shown": LETTERS_SHOWN}

    def act(self, action: str, body: Any) -> dict[str, Any]:
        """Run one redrive or purge (one at a time) and ask for a poll (not waited for:
        a run of actions shares one); the answer's ``"poll"`` is the poll count at which
        the page sees the action's effect."""
        if not isinstance(body, dict) or not isinstance(body.get("topic"), str):
            raise InvalidArgument('the body must be a JSON object with a "topic"')
        topic = body["topic"]
        every = body.get("all") is True
        with self.actions_lock:
            ctx = self.pq.context
            if action == "redrive":
                if every:
                    result = self.pq.redrive(topic).to_dict()
                else:
                    result = deadletter_picks.redrive_keys(ctx, topic, body.get("keys")).to_dict()
            elif every:
                result = {"deleted": self.pq.purge(topic, "dead-letter"), "kept": []}
            else:
                letters = body.get("letters")
                if not isinstance(letters, dict) or not all(
                        isinstance(v, str) for v in letters.values()):
                    raise InvalidArgument('"letters" must map dead-letter keys to ETags')
                deleted, kept = deadletter_picks.purge_keys(ctx, topic, letters)
                result = {"deleted": deleted, "kept": kept}
            log.warning("dashboard %s of %r: %s", action, topic,
                        {k: len(v) if isinstance(v, (list, dict)) else v
                         for k, v in result.items()})
        return {**result, "poll": self.poller.request_poll()}


def _handler(dash: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "pawnq-dashboard"
        sys_version = ""
        protocol_version = "HTTP/1.1"
        timeout = REQUEST_TIMEOUT
        body_read = False

        def version_string(self) -> str:
            """The ``Server:`` header: our name only (the base class appends
            ``sys_version`` after a space, even an empty one)."""
            return self.server_version

        def handle_one_request(self) -> None:
            server = self.server
            assert isinstance(server, TrackedServer)
            server.arm(self.request)  # the whole request within REQUEST_TIMEOUT
            try:
                super().handle_one_request()
            except OSError:
                if not server.expired(self.request):
                    raise
                self.close_connection = True  # cut off (deadline, stop): no answer

        def parse_request(self) -> bool:
            self.body_read = False  # per request: a kept-alive connection has several
            if self._cut_off() or not super().parse_request() or self._cut_off():
                return False
            if dash.stopping.is_set():
                self._send(503, b'{"error": "the dashboard is stopping"}',
                           "application/json", close=True)
                return False
            return True

        def _cut_off(self) -> bool:
            """The deadline passed (or the server stopped): close, answer nothing."""
            server = self.server
            assert isinstance(server, TrackedServer)
            if server.expired(self.request):
                self.close_connection = True
                return True
            return False

        def _body_left(self) -> bool:
            """The request came with a body this handler has not read."""
            length = (self.headers.get("Content-Length") or "0").strip()
            return not self.body_read and (
                "Transfer-Encoding" in self.headers or length != "0")

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, body: bytes, content_type: str,
                  close: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("X-Frame-Options", "DENY")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Content-Security-Policy", _CSP)
            if close or self._body_left():  # its bytes must not be read as the next request
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, doc: Any) -> None:
            self._send(status, json.dumps(doc).encode(), "application/json")

        def _refuse(self, refusal: tuple[int, str]) -> None:
            self._json(refusal[0], {"error": refusal[1]})

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if (refused := dash.guard.read_refusal(self.headers)) is not None:
                return self._refuse(refused)
            if url.path in _STATIC:
                name, kind = _STATIC[url.path]
                data = resources.files(__package__).joinpath("static", name).read_bytes()
                return self._send(200, data, kind)
            if not url.path.startswith("/api/"):
                return self._json(404, {"error": "not found"})
            if (refused := dash.guard.api_read_refusal(self.headers)) is not None:
                return self._refuse(refused)
            if url.path == "/api/state":
                return self._json(200, dash.state())
            if url.path == "/api/dead-letters":
                topic = (parse_qs(url.query).get("topic") or [""])[0]
                if not dash.poller.known_topic(topic):
                    return self._json(404, {"error": "no such topic in the last poll"})
                return self._guarded(lambda: {"topic": topic, "limit": LETTERS_SHOWN,
                                              "letters": dash.poller.dead_letters(topic)})
            return self._json(404, {"error": "not found"})

        do_HEAD = do_GET

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            if url.path not in ("/api/redrive", "/api/purge"):
                return self._json(404, {"error": "not found"})
            if (refused := dash.guard.action_refusal(self.headers)) is not None:
                return self._refuse(refused)
            if "Transfer-Encoding" in self.headers:
                return self._json(411, {"error": "send the body with a Content-Length"})
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                return self._json(400, {"error": "a bad Content-Length"})
            if not 0 < length <= MAX_BODY:
                return self._json(413, {"error": f"a body of 1 to {MAX_BODY} bytes"})
            try:
                data = self.rfile.read(length)  # bounded: REQUEST_TIMEOUT of silence
            except OSError:  # a client that stopped sending: drop the connection
                self.close_connection = True
                return None
            self.body_read = len(data) == length
            if self._cut_off():
                return None
            try:
                body = json.loads(data)
            except ValueError:
                return self._json(400, {"error": "the body is not JSON"})
            action = url.path.rsplit("/", 1)[1]
            return self._guarded(lambda: dash.act(action, body))

        def do_OPTIONS(self) -> None:  # no CORS preflight is ever granted
            self._json(405, {"error": "no cross-origin requests"})

        def _guarded(self, work: Any) -> None:
            """Run ``work`` and answer its JSON. A bad request says what is wrong with
            it (the library's own text about the request); any other failure only
            its type and a safe message (:func:`.security.public_error`)."""
            server = self.server
            assert isinstance(server, TrackedServer)
            server.disarm(self.request)  # the request is read: its work is not cut off
            try:
                answer = work()
            except InvalidArgument as exc:
                return self._json(400, {"error": str(exc)})
            except Exception as exc:
                status = 500
                if isinstance(exc, PawnQueueError):
                    status = 404 if isinstance(exc, TopicNotFoundError) else 502
                if status != 404:
                    log.warning("dashboard request failed: %s", logged_error(exc))
                return self._json(status, {"error": public_error(exc)})
            finally:
                server.arm(self.request)  # the answer's write is bounded again
            return self._json(200, answer)

    return Handler
