"""The HTTP/1.1 plumbing of the test proxies (:mod:`tests.fault_proxy`,
:mod:`tests.racy_proxy`): a threading TCP server whose connection handler reads requests
(Content-Length or chunked bodies, ``Expect: 100-continue``), forwards them over one
keep-alive connection to the server per client connection, and writes answers, S3 XML
errors, resets and silent closes; and which object key a request is about.

Hand-rolled rather than ``http.server``: one write per answer, no per-request header
parsing through ``email``, and full control of how a connection ends. A client that
goes away mid-answer only ends its own connection.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import struct
import sys
from socketserver import StreamRequestHandler, ThreadingTCPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape, unescape

import attrs

__all__ = [
    "Answer", "ClientConnection", "Request", "Server", "UpstreamGone", "object_key",
    "parse_upstream", "resign",
]

#: Headers that belong to one hop: never forwarded as they came.
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
     "upgrade", "expect", "content-length"}
)
CONDITION_HEADERS = ("if-none-match", "if-match")
#: Seconds to wait for the server's answer (SeaweedFS can take seconds on a losing
#: conditional PUT under load); clients have their own, shorter, read timeouts.
UPSTREAM_TIMEOUT = 120.0
#: Seconds to wait for a connection to the server (refused at once when it is down).
CONNECT_TIMEOUT = 5.0
_MAX_LINE = 65536
_FIRST_KEY = re.compile(rb"<Key>(.*?)</Key>", re.DOTALL)


@attrs.frozen
class Request:
    """One client request: ``headers`` without hop-by-hop ones (Host kept)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    keep_alive: bool

    @property
    def has_conditions(self) -> bool:
        """Whether it carries If-None-Match / If-Match."""
        return any(k.lower() in CONDITION_HEADERS for k, _ in self.headers)


@attrs.frozen
class Answer:
    """The server's answer, read whole."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


class UpstreamGone(Exception):
    """The server could not be reached (``sent`` False) or failed after the request
    went out (``sent`` True: it may have applied it)."""

    def __init__(self, sent: bool) -> None:
        super().__init__("sent" if sent else "not sent")
        self.sent = sent


class Server(ThreadingTCPServer):
    """A thread per client connection (daemon), a deep accept backlog, quiet about
    clients that go away; ``proxy`` is set by the owner and serves each request."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512
    proxy: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _line(rfile: Any) -> bytes:
    line: bytes = rfile.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ValueError("line too long")
    return line


def read_head(rfile: Any) -> tuple[list[str], list[tuple[str, str]]] | None:
    """The first line's words and the headers of a request or answer; None at EOF."""
    line = _line(rfile)
    while line in (b"\r\n", b"\n"):
        line = _line(rfile)
    if not line:
        return None
    headers = []
    while True:
        raw = _line(rfile)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return line.decode("latin-1").strip().split(None, 2), headers


def read_body(rfile: Any, low: dict[str, str], *, to_eof: bool = False) -> bytes:
    """A message body: chunked, or Content-Length bytes, or (``to_eof``, an answer
    with neither) all until the connection ends."""
    if "chunked" in low.get("transfer-encoding", "").lower():
        chunks = []
        while True:
            size = int(_line(rfile).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while _line(rfile) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(rfile.read(size))
            _line(rfile)
    if "content-length" not in low and to_eof:
        return bytes(rfile.read())
    length = int(low.get("content-length") or 0)
    body: bytes = rfile.read(length) if length else b""
    if len(body) != length:
        raise ValueError("short body")
    return body


class Upstream:
    """One keep-alive connection to the server at ``addr``."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        try:
            self.sock = socket.create_connection(addr, timeout=CONNECT_TIMEOUT)
        except OSError:
            raise UpstreamGone(sent=False) from None
        self.sock.settimeout(UPSTREAM_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb")
        self._poller = select.poll()
        self._poller.register(self.sock, select.POLLIN)

    def idle_and_open(self) -> bool:
        """Whether the connection is still open: no EOF (nor stray bytes) waiting."""
        return not self._poller.poll(0)

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()

    def exchange(self, req: Request) -> tuple[Answer, bool]:
        """Send ``req``, read the answer; and whether the connection must close."""
        lines = [f"{req.method} {req.target} HTTP/1.1\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in req.headers]
        if req.body or req.method in ("PUT", "POST"):
            lines.append(f"Content-Length: {len(req.body)}\r\n")
        lines.append("\r\n")
        self.sock.sendall("".join(lines).encode("latin-1") + req.body)
        got = read_head(self.rfile)
        while got is not None and got[0][1].startswith("1"):  # 100 Continue and the like
            got = read_head(self.rfile)
        if got is None:
            raise ValueError("closed without an answer")
        (version, status, *reason), headers = got
        low = {k.lower(): v for k, v in headers}
        code = int(status)
        no_body = req.method == "HEAD" or code in (204, 304)
        body = b"" if no_body else read_body(self.rfile, low, to_eof=True)
        close = low.get("connection", "").lower() == "close" or version != "HTTP/1.1" or (
            not no_body and "content-length" not in low and "chunked" not in
            low.get("transfer-encoding", "").lower()
        )
        return Answer(code, reason[0] if reason else "", headers, body), close


class ClientConnection(StreamRequestHandler):
    """One client connection: requests one after another (HTTP/1.1 keep-alive), each
    served by ``server.proxy._handle(self, request)`` (False: close the connection)."""

    server: Server
    disable_nagle_algorithm = True
    timeout = 120  # idle seconds before a client connection is closed

    def setup(self) -> None:
        super().setup()
        self._up: Upstream | None = None
        with self.server.proxy._lock:
            self.server.proxy._clients.add(self.connection)

    def handle(self) -> None:
        proxy = self.server.proxy
        try:
            while not proxy._stopping.is_set():
                request = self._read_request()
                if request is None or not proxy._handle(self, request):
                    break
                if not request.keep_alive:
                    break
        except (OSError, ValueError):
            pass  # the client went away or spoke nonsense: end this connection only

    def finish(self) -> None:
        with self.server.proxy._cond:
            self.server.proxy._clients.discard(self.connection)
            self.server.proxy._cond.notify_all()
        self._drop_upstream()
        with contextlib.suppress(OSError):
            super().finish()

    def _read_request(self) -> Request | None:
        got = read_head(self.rfile)
        if got is None:
            return None
        (method, target, version), headers = got
        low = {k.lower(): v for k, v in headers}
        connection = low.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        if low.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = read_body(self.rfile, low)
        kept = tuple((k, v) for k, v in headers if k.lower() not in HOP_HEADERS)
        return Request(method, target, kept, body, keep_alive)

    # -- the server -------------------------------------------------------------------

    def _drop_upstream(self) -> None:
        if self._up is not None:
            self._up.close()
            self._up = None

    def forward(self, req: Request, addr: tuple[str, int]) -> Answer:
        """Send ``req`` to the server at ``addr`` on this connection's keep-alive
        connection (opened again if the server closed it or moved); its answer."""
        if self._up is not None and (self._up.addr != addr or not self._up.idle_and_open()):
            self._drop_upstream()
        if self._up is None:
            self._up = Upstream(addr)
        try:
            answer, close = self._up.exchange(req)
        except (OSError, ValueError, IndexError):
            self._drop_upstream()
            raise UpstreamGone(sent=True) from None
        if close:
            self._drop_upstream()
        return answer

    # -- answering --------------------------------------------------------------------

    def _send(self, req: Request, status: int, reason: str,
              headers: list[tuple[str, str]], body: bytes) -> bool:
        lines = [f"HTTP/1.1 {status} {reason}\r\n"]
        length = None
        for name, value in headers:
            low = name.lower()
            if low == "content-length":
                length = value
            elif low not in HOP_HEADERS:
                lines.append(f"{name}: {value}\r\n")
        head = req.method == "HEAD"
        lines.append(f"Content-Length: {length if head and length else len(body)}\r\n")
        if not req.keep_alive:
            lines.append("Connection: close\r\n")
        lines.append("\r\n")
        try:
            self.wfile.write("".join(lines).encode("latin-1") + (b"" if head else body))
        except OSError:
            return False
        return True

    def send_answer(self, req: Request, answer: Answer) -> bool:
        """Pass the server's answer on; False if the client is gone."""
        return self._send(req, answer.status, answer.reason, answer.headers, answer.body)

    def send_error(self, req: Request, status: int, reason: str, code: str, message: str) -> bool:
        """Answer with S3's XML error ``code``; False if the client is gone."""
        resource = escape(req.target.split("?", 1)[0])
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
            f"<Resource>{resource}</Resource><RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        headers = [("Content-Type", "application/xml"), ("x-amz-request-id", "fault-proxy")]
        return self._send(req, status, reason, headers, body)

    def reset(self) -> None:
        """Close the client's connection with an RST (SO_LINGER 0)."""
        try:
            self.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            self.rfile.close()  # the socket's file descriptor closes with its last user
            self.connection.close()
        except OSError:
            pass

    def close(self) -> None:
        """Close the client's connection without an answer (FIN)."""
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def resign(req: Request, credentials: tuple[str, str, str]) -> Request:
    """``req`` without its condition headers, signed again (SigV4, botocore)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    drop = {*CONDITION_HEADERS, "authorization", "x-amz-date", "x-amz-content-sha256"}
    kept = {k: v for k, v in req.headers if k.lower() not in drop}
    host = next(v for k, v in req.headers if k.lower() == "host")
    signed = AWSRequest(
        method=req.method, url=f"http://{host}{req.target}", data=req.body, headers=kept
    )
    key, secret, region = credentials
    S3SigV4Auth(Credentials(key, secret), "s3", region).add_auth(signed)
    return attrs.evolve(req, headers=tuple(signed.headers.items()))


def parse_upstream(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http://host:port`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None:
        raise ValueError(f"upstream must be http://host:port, not {url!r}")
    return parts.hostname, parts.port


def object_key(req: Request, path: str) -> str:
    """The object key of a path-style request (bucket stripped); a LIST's ``?prefix=``;
    a DeleteObjects' first key (one batch is one topic's keys)."""
    _, _, key = unquote(path).lstrip("/").partition("/")
    if key or "?" not in req.target:
        return key
    query = parse_qs(req.target.split("?", 1)[1], keep_blank_values=True)
    if req.method == "GET":
        return query.get("prefix", [""])[0]
    if req.method == "POST" and "delete" in query:
        found = _FIRST_KEY.search(req.body)
        return unescape(found.group(1).decode()) if found else ""
    return ""
