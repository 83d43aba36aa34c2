"""A fault-injecting S3 proxy on loopback, for the chaos suite (benchmarks/chaos) and
the tests: seeded, bounded in count (``max_faults``) and time (``active_seconds``), with
rules per operation and per key prefix.

Faults (:class:`FaultRule` ``kind``):

* ``delay_request`` / ``delay_answer``: hold the request before forwarding it, or the
  server's answer before sending it back, ``delay_seconds`` each;
* ``error_500`` / ``slowdown_503``: answer S3's XML ``InternalError`` / ``SlowDown``
  without forwarding;
* ``reset``: close the client's connection with an RST (``SO_LINGER`` 0), not forwarded;
* ``read_timeout``: forward nothing, hold ``delay_seconds``, then close: the client's
  read timeout fires first;
* ``drop_answer``: forward (the server applies it), then close without answering: the
  ambiguous case a client can't tell from a lost request.

``racing_cas=True`` models a server whose conditional writes race (SeaweedFS issue
8800): a PUT or DELETE carrying If-None-Match / If-Match waits up to ``overlap_wait``
seconds (an event, not a sleep) for another request on the same key to be in flight,
and while two overlap their condition headers are dropped and the requests signed
again (the server checks signatures), so both succeed; a lone one keeps its headers.
It is on from ``start()``, armed or not (the capability probe runs first thing), and
each request it strips is logged as a :class:`FaultEvent` of kind ``racing_cas``.

Forwarding keeps the client's Host header and signature (SeaweedFS checks SigV4 against
the proxy's host:port). Each client connection (one thread of the threading server)
keeps one keep-alive connection to the server, checked before reuse and opened again
after an error. An unreachable server (a restart) is answered 503 ``ServiceUnavailable``
(nothing was sent, so clients retry); a server that fails after the request went out
closes the client's connection unanswered, as a crashing server would.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from tests.proxy_wire import (
    Answer,
    ClientConnection,
    Request,
    Server,
    UpstreamGone,
    object_key,
    parse_upstream,
    resign,
)
from tests.servers import ACCESS_KEY, REGION, SECRET_KEY

__all__ = ["FaultEvent", "FaultKind", "FaultProxy", "FaultRule"]

FaultKind = Literal[
    "error_500", "slowdown_503", "reset", "read_timeout", "drop_answer",
    "delay_request", "delay_answer",
]
#: Faults that end a request (at most one per request); delays come on top of them.
_TERMINAL = frozenset({"error_500", "slowdown_503", "reset", "read_timeout", "drop_answer"})
_KINDS = _TERMINAL | {"delay_request", "delay_answer"}
_METHODS = frozenset({"GET", "PUT", "POST", "DELETE", "HEAD"})
#: S3's answers for the two error faults: status, reason, code, message.
_ERRORS = {
    "error_500": (500, "Internal Server Error", "InternalError",
                  "We encountered an internal error. Please try again."),
    "slowdown_503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}
#: A fault decided for a request: kind, delay_seconds, when (the proxy's clock).
_Fault = tuple[str, float, float]
#: What FaultProxy._forward returns when the server failed after the request was sent.
_CLOSE = Answer(0, "", [], b"")
_UNAVAILABLE = (503, "Service Unavailable", "ServiceUnavailable",
                "The server is unreachable from the proxy. Please try again.")


@attrs.frozen
class FaultRule:
    """Which requests get which fault, and how often (drawn from the proxy's seeded RNG)."""

    kind: FaultKind = attrs.field(validator=attrs.validators.in_(_KINDS))
    probability: float = attrs.field(validator=[attrs.validators.ge(0), attrs.validators.le(1)])
    #: Empty: every method (GET PUT POST DELETE HEAD).
    methods: frozenset[str] = attrs.field(
        default=frozenset(), converter=frozenset,
        validator=lambda _self, _attr, value: _check_methods(value),
    )
    #: Object-key prefix inside the bucket; a LIST matches on its ``?prefix=``, a
    #: DeleteObjects on its first key.
    prefix: str = ""
    #: delay_*: the delay; read_timeout: how long to hold before closing unanswered.
    delay_seconds: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    #: Only requests carrying If-None-Match / If-Match.
    conditional_only: bool = False

    def matches(self, method: str, key: str, conditional: bool) -> bool:
        """Whether a request of ``method`` on ``key`` is subject to this rule."""
        return (
            (not self.methods or method in self.methods)
            and key.startswith(self.prefix)
            and (conditional or not self.conditional_only)
        )


@attrs.frozen
class FaultEvent:
    """One injected fault. ``t`` is ``time.monotonic()`` when it was decided (system-wide
    on Linux, so comparable across processes); ``applied``: whether the server got and
    applied the request (a 2xx answer), None when unknown (the server failed)."""

    t: float
    kind: str
    method: str
    key: str
    delay_seconds: float
    applied: bool | None


class FaultProxy:
    """The proxy: ``start()`` (or ``with``), ``arm()`` to begin injecting, ``disarm()``.

    ``requests`` counts requests received; ``overlapped`` those that arrived while
    another on the same key was in flight (counted with ``racing_cas`` only);
    ``stripped`` those whose conditions were dropped; ``unreachable`` those answered
    503 because the server could not be reached (down, restarting), ``upstream_failed``
    those whose client connection was closed because the server failed once the
    request was sent (not faults of ours, counted apart). ``clock`` times ``active_seconds``
    and the events (tests pass a fake one).
    """

    #: Track requests in flight per key even when not racing (RacyProxy's honest mode).
    _track_overlap = False

    def __init__(
        self,
        upstream: str,
        *,
        rules: Sequence[FaultRule] = (),
        seed: int = 0,
        max_faults: int | None = None,
        active_seconds: float | None = None,
        racing_cas: bool = False,
        overlap_wait: float = 0.5,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        region: str = REGION,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._addr = parse_upstream(upstream)
        self._rules = tuple(rules)
        self._rng = random.Random(seed)
        self.max_faults = max_faults
        self.active_seconds = active_seconds
        self.racing_cas = racing_cas
        self.overlap_wait = overlap_wait
        self._credentials = (access_key, secret_key, region)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._in_flight: dict[str, int] = {}
        self._armed_at: float | None = None
        self._injected = 0
        self._faults: list[FaultEvent] = []
        self.requests = 0
        self.overlapped = 0
        self.stripped = 0
        self.unreachable = 0
        self.upstream_failed = 0
        self._stopping = threading.Event()
        self._clients: set[socket.socket] = set()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # -- control ----------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def upstream(self) -> str:
        return "http://{}:{}".format(*self._addr)

    @upstream.setter
    def upstream(self, url: str) -> None:
        self.set_upstream(url)

    def set_upstream(self, url: str) -> None:
        """Forward to ``url`` from the next request on (open connections reconnect)."""
        self._addr = parse_upstream(url)

    def set_rules(self, rules: Sequence[FaultRule]) -> None:
        with self._lock:
            self._rules = tuple(rules)

    def arm(self) -> None:
        """Begin injecting; ``active_seconds`` counts from now."""
        with self._lock:
            self._armed_at = self._clock()

    def disarm(self) -> None:
        """No more faults (requests are still forwarded; racing_cas stays on)."""
        with self._lock:
            self._armed_at = None

    @property
    def open_connections(self) -> int:
        """Client connections open now."""
        with self._lock:
            return len(self._clients)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds, checked whenever a fault is recorded or a
        client connection ends; whether it held within ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def fault_log(self) -> list[FaultEvent]:
        """The faults injected so far, by time."""
        with self._lock:
            return sorted(self._faults, key=lambda e: e.t)

    @property
    def faults(self) -> list[FaultEvent]:
        return self.fault_log()

    def start(self) -> FaultProxy:
        self._stopping.clear()
        self._server = Server(("127.0.0.1", 0), ClientConnection)
        self._server.proxy = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every client connection, and wait (a few seconds at
        most) for their threads to end; a held request is not forwarded any more."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        # their threads end at once unless the server is slow to answer: nothing is
        # forwarded once this returns, as far as a few seconds allow
        self.wait_for(lambda: not self._clients, timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- per request ------------------------------------------------------------------

    def _seen(self, method: str, path: str) -> None:
        """Hook for subclasses: every request received (``path`` without its query)."""

    def _decide(self, method: str, key: str, conditional: bool) -> list[_Fault]:
        """The faults for one request (kind, delay, when decided); counts the request."""
        with self._lock:
            self.requests += 1
            if self._armed_at is None:
                return []
            now = self._clock()
            if self.active_seconds is not None and now - self._armed_at >= self.active_seconds:
                return []
            chosen = []
            for rule in self._rules:
                if self.max_faults is not None and self._injected >= self.max_faults:
                    break
                if not rule.matches(method, key, conditional):
                    continue
                if self._rng.random() >= rule.probability:
                    continue
                self._injected += 1
                chosen.append((rule.kind, rule.delay_seconds, now))
                if rule.kind in _TERMINAL:
                    break
            return chosen

    def _record(self, plan: Sequence[_Fault], req: Request, key: str,
                applied: bool | None) -> None:
        """Log the faults of ``plan``."""
        if not plan:
            return
        with self._cond:
            self._faults.extend(
                FaultEvent(t, kind, req.method, key, delay, applied) for kind, delay, t in plan
            )
            self._cond.notify_all()

    def _sleep(self, seconds: float) -> None:
        """A fault's delay; cut short only by stop()."""
        if seconds > 0:
            self._stopping.wait(seconds)

    def _enter(self, path: str, conditional: bool) -> bool:
        """Register a request on ``path``; True when its conditions are to be dropped."""
        with self._cond:
            self._in_flight[path] = self._in_flight.get(path, 0) + 1
            if self._in_flight[path] >= 2:
                self.overlapped += 1
            self._cond.notify_all()
            if not (conditional and self.racing_cas):
                return False
            self._cond.wait_for(
                lambda: self._in_flight[path] >= 2 or self._stopping.is_set(), self.overlap_wait
            )
            overlapping = self._in_flight[path] >= 2
            if overlapping:
                self.stripped += 1
            return overlapping

    def _leave(self, path: str) -> None:
        with self._cond:
            self._in_flight[path] -= 1
            if not self._in_flight[path]:
                del self._in_flight[path]

    def _handle(self, conn: ClientConnection, req: Request) -> bool:
        """Serve one request on ``conn``; False when the connection is to be closed."""
        path = req.target.split("?", 1)[0]
        self._seen(req.method, path)
        key = object_key(req, path)
        plan = self._decide(req.method, key, req.has_conditions)
        terminal = next((kind for kind, _, _ in plan if kind in _TERMINAL), None)
        for kind, delay, _ in plan:
            if kind == "delay_request":
                self._sleep(delay)
        if self._stopping.is_set():  # stopped while held: not sent late
            terminal = "read_timeout"
        if terminal is not None and terminal != "drop_answer":
            self._record(plan, req, key, False)
            if terminal == "reset":
                conn.reset()
                return False
            if terminal == "read_timeout":
                self._sleep(max((d for k, d, _ in plan if k == terminal), default=0.0))
                conn.close()
                return False
            return conn.send_error(req, *_ERRORS[terminal])
        answer = self._forward(conn, req, path, key, plan)
        if answer is None:
            return conn.send_error(req, *_UNAVAILABLE)
        if answer is _CLOSE or terminal == "drop_answer":
            conn.close()
            return False
        for kind, delay, _ in plan:
            if kind == "delay_answer":
                self._sleep(delay)
        return conn.send_answer(req, answer)

    def _forward(self, conn: ClientConnection, req: Request, path: str, key: str,
                 plan: list[_Fault]) -> Answer | None:
        """The server's answer to ``req`` (its conditions dropped if racing); None if
        the server could not be reached, ``_CLOSE`` if it failed once it was sent."""
        track = self.racing_cas or self._track_overlap
        conditional = req.method in ("PUT", "DELETE") and req.has_conditions
        strip = self._enter(path, conditional) if track else False
        try:
            if strip:
                req = resign(req, self._credentials)
            answer = conn.forward(req, self._addr)
        except UpstreamGone as gone:
            self._record(plan, req, key, None)
            with self._lock:
                if gone.sent:
                    self.upstream_failed += 1
                else:
                    self.unreachable += 1
            return _CLOSE if gone.sent else None
        finally:
            if track:
                self._leave(path)
        applied = 200 <= answer.status < 300
        if strip:
            self._record([("racing_cas", 0.0, self._clock())], req, key, applied)
        self._record(plan, req, key, applied)
        return answer


def _check_methods(methods: frozenset[str]) -> None:
    if not methods <= _METHODS:
        raise ValueError(f"methods must be among {sorted(_METHODS)}, not {sorted(methods)}")
