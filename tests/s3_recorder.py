"""A loopback S3 stand-in for the S3 store's regression tests: it records every request
(method, path, headers, body, arrival) and answers as told, so a test sees exactly what
was sent and can make the server answer what real servers rarely do (no Date, no
LastModified, a bad timestamp, access denied, no answer at all)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import pytest

from pawn_queue_sync.config import S3Config
from pawn_queue_sync.storage.s3 import S3Store

ACCESS_KEY = "AKIAREGRESSIONCHECK1"
SECRET_KEY = "regression+Secret/key_0123456789abcdef"
#: the password inside endpoint URLs: distinctive, so any leak is a substring match
URL_PASSWORD = "Url-Pa55word-LEAK"
BUCKET = "bkt"
REGION = "us-east-1"

Reply = tuple[int, dict[str, str], bytes]


@attrs.frozen
class Seen:
    """One request as it arrived."""

    method: str
    path: str  # the raw request target, query included
    headers: list[tuple[str, str]]
    body: bytes
    arrived: float  # time.monotonic() at arrival (same process, same clock)

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(found) <= 1, f"header {name} sent {len(found)} times"
        return found[0] if found else None


class Recorder:
    """A loopback HTTP/1.1 server that records requests and answers with ``reply``
    (default: what S3 answers to a successful PUT/GET/HEAD/DELETE/DeleteObjects/LIST)."""

    def __init__(self, port: int = 0) -> None:
        self.seen: list[Seen] = []
        self.reply: Callable[[Seen], Reply] | None = None
        self.date = True  # send a Date header
        self.released = threading.Event()  # set at close: frees held answers
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(self.command, self.path, list(self.headers.items()), body,
                            time.monotonic())
                recorder.seen.append(seen)
                status, headers, out = (recorder.reply or default_reply)(seen)
                self.send_response_only(status)
                if recorder.date:
                    self.send_header("Date", self.date_time_string())
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(out)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def endpoint(self, host: str = "127.0.0.1", userinfo: str = "") -> str:
        return f"http://{userinfo}{host}:{self.port}"

    def hold(self, seen: Seen) -> Reply:
        """A reply that comes only once the test ends (a server that never answers)."""
        self.released.wait(60)
        return 500, {}, b""

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def default_reply(seen: Seen) -> Reply:
    if seen.method == "GET" and "list-type=2" in seen.path:
        return 200, {"Content-Type": "application/xml"}, listing_xml([("t/a.lease", None)])
    if seen.method == "POST":
        return 200, {"Content-Type": "application/xml"}, b"<DeleteResult></DeleteResult>"
    if seen.method == "DELETE":
        return 204, {}, b""
    if seen.method == "GET":
        return 200, {"ETag": '"abc"', "Last-Modified": "Thu, 26 Nov 2026 10:00:00 GMT"}, b"{}"
    return 200, {"ETag": '"abc"'}, b""


def listing_xml(rows: list[tuple[str, str | None]]) -> bytes:
    """A ListObjectsV2 answer; a row's LastModified is left out when None."""
    contents = "".join(
        f"<Contents><Key>{key}</Key>"
        + (f"<LastModified>{modified}</LastModified>" if modified is not None else "")
        + "<ETag>&quot;abc&quot;</ETag><Size>2</Size><StorageClass>STANDARD</StorageClass>"
        "</Contents>"
        for key, modified in rows
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{BUCKET}</Name><Prefix>t/</Prefix><KeyCount>{len(rows)}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>{contents}"
        "</ListBucketResult>"
    ).encode()


def access_denied(seen: Seen) -> Reply:
    return 403, {"Content-Type": "application/xml"}, (
        b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
    )


def recording() -> Iterator[Recorder]:
    """A running :class:`Recorder`, closed afterwards (the tests' ``recorder`` fixture)."""
    rec = Recorder()
    yield rec
    rec.close()


def store_at(
    endpoint: str, *, fast: bool = True, build: bool = True, **overrides: Any
) -> S3Store:
    """A store on ``endpoint``; ``build``: its client is built now (and checked to take
    the fast path or not, as asked), else on first use."""
    values: dict[str, Any] = {
        "endpoint_url": endpoint,
        "bucket_name": BUCKET,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "region_name": REGION,
        "use_ssl": False,
        "addressing_style": "path",
        "fast_path": fast,
        "max_attempts": 1,
        "connect_timeout_seconds": 2.0,
        "read_timeout_seconds": 10.0,
    }
    values.update(overrides)
    store = S3Store(S3Config(**values))
    if build:
        assert store.fast_path is fast
    return store


PATHS = pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "boto3"])
