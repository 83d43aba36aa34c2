"""The dashboard's HTTP server: ``ThreadingHTTPServer`` that knows its connections.

The standard server starts a daemon thread per connection and forgets it, so (a) a
kept-alive connection goes on being served after ``shutdown()``, (b) a socket timeout,
which restarts with every byte received, lets a client that trickles a request hold
its thread as long as it likes, and (c) the threads have no bound. This one tracks
each open connection: at most :attr:`TrackedServer.max_connections` at once (the next
gets a 503 and is closed at once, with no thread), a deadline for each request (its
line, headers and body) after which a watchdog shuts the socket down, and
:meth:`TrackedServer.close_connections` to end them all when the dashboard stops.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

__all__ = ["TrackedServer", "TrackedServerV6"]

_BUSY_BODY = b'{"error": "too many connections"}'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
         % len(_BUSY_BODY)) + _BUSY_BODY


class _Conn:
    """One open connection: the monotonic deadline of the request it waits for (None
    while the request is being worked on), and whether the watchdog cut it off."""

    __slots__ = ("deadline", "expired")

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.expired = False


class TrackedServer(ThreadingHTTPServer):
    """See the module. ``max_connections``, ``request_timeout``: set after building."""

    max_connections = 32
    request_timeout = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._conns: dict[socket.socket, _Conn] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._watchdog: threading.Thread | None = None
        super().__init__(*args, **kwargs)

    # -- accepting and ending connections ---------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._cond:
            refuse = self._closed or len(self._conns) >= self.max_connections
            if not refuse:
                self._conns[request] = _Conn()
                if self._watchdog is None:
                    self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                      name="pawnq-dashboard-watchdog")
                    self._watchdog.start()
        if refuse:  # answered from the accepting thread: a small write, bounded
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._cond:
            if self._conns.pop(request, None) is not None:
                self._cond.notify_all()
        super().shutdown_request(request)

    def open_connections(self) -> int:
        with self._cond:
            return len(self._conns)

    def wait_open_below(self, n: int, timeout: float | None = None) -> bool:
        """Wait until fewer than ``n`` connections are open; True if so in time."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._conns) < n, timeout)

    def close_connections(self) -> None:
        """Refuse new connections and shut down every open one (a handler blocked on
        it wakes to end of file, a write fails): nothing is served after this."""
        with self._cond:
            self._closed = True
            conns = list(self._conns.items())
            self._cond.notify_all()
        for sock, conn in conns:
            conn.expired = True
            _shut(sock)

    # -- the request deadline ----------------------------------------------------------------

    def arm(self, request: Any) -> None:
        """A request is awaited on ``request``: it must be read in full (line, headers,
        body) within :attr:`request_timeout` seconds."""
        with self._cond:
            conn = self._conns.get(request)
            if conn is not None:
                conn.deadline = time.monotonic() + self.request_timeout
                self._cond.notify_all()

    def disarm(self, request: Any) -> None:
        """The request is read: its work is not bounded by the deadline."""
        with self._cond:
            conn = self._conns.get(request)
            if conn is not None:
                conn.deadline = None

    def expired(self, request: Any) -> bool:
        """The watchdog (or :meth:`close_connections`) cut this connection off."""
        with self._cond:
            conn = self._conns.get(request)
            return self._closed or (conn is not None and conn.expired)

    def _watch(self) -> None:
        """Shut down each connection past its deadline; sleeps until the next one."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                due = [c.deadline for c in self._conns.values() if c.deadline is not None]
                for sock, conn in self._conns.items():
                    if conn.deadline is not None and conn.deadline <= now:
                        conn.deadline, conn.expired = None, True
                        _shut(sock)
                left = [d - now for d in due if d > now]
                self._cond.wait(min(left, default=None))


class TrackedServerV6(TrackedServer):
    address_family = socket.AF_INET6


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by its client or handler
        sock.shutdown(socket.SHUT_RDWR)
