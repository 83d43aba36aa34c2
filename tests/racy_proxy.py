"""A loopback HTTP proxy in front of an S3 server that can make conditional writes race,
for the capability probe's tests (test_probe_race.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.servers import ACCESS_KEY, REGION, SECRET_KEY

#: Headers that belong to one hop: never forwarded as they came.
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
     "upgrade", "expect", "content-length"}
)
_CONDITION_HEADERS = ("if-none-match", "if-match")


class RacyProxy:
    """A loopback HTTP proxy in front of an S3 server, for the capability probe's tests.

    Honest (``strip_overlapping=False``) it forwards every request as it came. Racy, it
    models a server whose conditional writes break under concurrency (SeaweedFS issue
    8800): a PUT or DELETE carrying If-None-Match / If-Match waits up to
    ``overlap_wait`` seconds for another request on the same key to be in flight (an
    event, not a sleep: it goes on as soon as one arrives), and while two overlap it
    drops their condition headers and signs them again (the server checks
    signatures), so both succeed. A lone conditional request keeps its headers.

    ``requests`` lists ``(method, path)`` of every request received; ``stripped``
    counts requests whose conditions were dropped; ``overlapped`` counts requests that
    arrived while another one on the same key was in flight (honest or not).
    """

    def __init__(
        self,
        upstream: str,
        *,
        strip_overlapping: bool,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        region: str = REGION,
        overlap_wait: float = 0.5,
    ) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.strip_overlapping = strip_overlapping
        self.overlap_wait = overlap_wait
        self._credentials = (access_key, secret_key, region)
        self._cond = threading.Condition()
        self._in_flight: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.stripped = 0
        self.overlapped = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def count(self, path_prefix: str = "", method: str | None = None) -> int:
        """How many requests had a path starting with ``path_prefix`` (and ``method``)."""
        with self._cond:
            return sum(
                1 for m, p in self.requests
                if p.startswith(path_prefix) and (method is None or m == method)
            )

    def start(self) -> RacyProxy:
        from http.server import ThreadingHTTPServer

        proxy = self
        handler = type("Handler", (_ProxyHandler,), {"proxy": proxy})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="racy-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> RacyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- used by the handler ----------------------------------------------------------

    def _record(self, method: str, path: str) -> None:
        with self._cond:
            self.requests.append((method, path))

    def _enter(self, key: str, conditional: bool) -> bool:
        """Register a request on ``key``; True when its conditions are to be dropped."""
        with self._cond:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            if self._in_flight[key] >= 2:
                self.overlapped += 1
            self._cond.notify_all()
            if not (conditional and self.strip_overlapping):
                return False
            self._cond.wait_for(lambda: self._in_flight[key] >= 2, self.overlap_wait)
            overlapping = self._in_flight[key] >= 2
            if overlapping:
                self.stripped += 1
            return overlapping

    def _leave(self, key: str) -> None:
        with self._cond:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]

    def _resign(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> list[tuple[str, str]]:
        """``headers`` without the condition headers, signed again (SigV4, botocore)."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        drop = {*_CONDITION_HEADERS, "authorization", "x-amz-date", "x-amz-content-sha256"}
        kept = {k: v for k, v in headers if k.lower() not in drop}
        host = next(v for k, v in headers if k.lower() == "host")
        request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=kept)
        key, secret, region = self._credentials
        S3SigV4Auth(Credentials(key, secret), "s3", region).add_auth(request)
        return list(request.headers.items())


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards one request at a time on its connection (HTTP/1.1 keep-alive)."""

    proxy: RacyProxy
    protocol_version = "HTTP/1.1"
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pytest shows failures, not every request."""

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        import http.client
        from urllib.parse import urlsplit

        proxy = self.proxy
        method, path = self.command, self.path
        body = self._body()
        key = urlsplit(path).path
        proxy._record(method, key)
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS]
        conditional = method in ("PUT", "DELETE") and any(
            k.lower() in _CONDITION_HEADERS for k, _ in headers
        )
        strip = proxy._enter(key, conditional)
        try:
            if strip:
                headers = proxy._resign(method, path, headers, body)
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    conn.putheader(name, value)
                if body or method in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                resp = conn.getresponse()
                data = resp.read()
                status, reason, got = resp.status, resp.reason, resp.getheaders()
            finally:
                conn.close()
        finally:
            proxy._leave(key)
        self.send_response_only(status, reason)
        for name, value in got:
            if name.lower() not in _HOP_HEADERS:
                self.send_header(name, value)
        length = next((v for k, v in got if k.lower() == "content-length"), None)
        self.send_header(
            "Content-Length", length if method == "HEAD" and length else str(len(data))
        )
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward
