"""Regressions of the S3 store (``storage/s3/``), each against
what reaches a server: a loopback HTTP server records every request (method, path,
headers, body, arrival) and answers as told, so a test sees exactly what was sent and
can make the server answer what real servers rarely do (no Date, no LastModified, a
bad timestamp, access denied, no answer at all).

1. the fast path signs the Host header it sends (every endpoint spelling);
2. credentials inside ``endpoint_url`` never show;
3. no client clock stands in for the server's;
4. an unreadable LastModified is a StorageError naming the key;
5. a closed store stays closed;
6. a deadline bounds a request, retries included;
7. a fork while another thread is inside the store does not deadlock the child.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest

from pawn_queue_sync import PawnQueue, errors, load_config
from pawn_queue_sync.config import S3Config
from pawn_queue_sync.errors import StorageError, StoreUnavailable
from pawn_queue_sync.storage.memory import MemoryStore
from pawn_queue_sync.storage.s3 import S3Store
from pawn_queue_sync.storage.s3.secrets import SECRET_FILTER
from pawn_queue_sync.storage.s3.wire import _Request

from .forking import in_child
from .servers import S3Server, closed_port, config_dict

ACCESS_KEY = "AKIAREGRESSIONCHECK1"
SECRET_KEY = "regression+Secret/key_0123456789abcdef"
#: the password inside endpoint URLs: distinctive, so any leak is a substring match
URL_PASSWORD = "Url-Pa55word-LEAK"
BUCKET = "bkt"
REGION = "us-east-1"

Reply = tuple[int, dict[str, str], bytes]


# --------------------------------------------------------------------------- the recorder


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
                status, headers, out = (recorder.reply or _default_reply)(seen)
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


def _default_reply(seen: Seen) -> Reply:
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


def _access_denied(seen: Seen) -> Reply:
    return 403, {"Content-Type": "application/xml"}, (
        b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
    )


@pytest.fixture
def recorder() -> Iterator[Recorder]:
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


# ---------------------------------------------------------------- 1. the signed Host


def signature_verifies(seen: Seen) -> bool:
    """Verify a request's SigV4 signature as a signature-checking server does: from the
    headers it received (the Host header included) and the SignedHeaders it was told,
    with botocore's own signer doing the arithmetic."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth = seen.header("authorization") or ""
    match = re.fullmatch(
        r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, "
        r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})",
        auth,
    )
    assert match, auth
    access, _, region, signed, signature = match.groups()
    assert access == ACCESS_KEY and region == REGION
    names = signed.split(";")
    assert "host" in names
    headers = {name: seen.header(name) or "" for name in names}
    request = AWSRequest(
        method=seen.method, url=f"http://{seen.header('host')}{seen.path}", headers=headers,
        data=seen.body,
    )
    request.context["timestamp"] = seen.header("x-amz-date")
    signer = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION)
    canonical = signer.canonical_request(request)
    return bool(signer.signature(signer.string_to_sign(request, canonical), request)
                == signature)


def _exercise(store: S3Store) -> None:
    store.put("t/a.lease", b"{}", if_none_match=True)
    store.get("t/a.lease")
    store.head("t/a.lease")
    store.list("t/")
    store.delete("t/a.lease", if_match="abc")
    store.delete_many(["t/a.lease", "t/b.lease"])


@pytest.mark.parametrize(
    ("host", "userinfo"),
    [
        ("127.0.0.1", ""),
        ("LocalHost", ""),  # a name in capitals: urllib3 sends it lower-cased
        ("127.0.0.1", f"user:{URL_PASSWORD}@"),  # userinfo: never sent
    ],
    ids=["plain", "capitals", "userinfo"],
)
def test_fast_path_signs_the_host_header_it_sends(
    recorder: Recorder, host: str, userinfo: str
) -> None:
    """What a server that checks signatures sees: the Host header that arrived is the one
    signed, so botocore's signer, given the received request, finds the same signature.
    (Before: the fast path signed the endpoint's netloc verbatim, and ``LocalHost:P`` or
    ``user:pw@host:P`` arrived as ``localhost:P`` / ``host:P``: SignatureDoesNotMatch.)"""
    store = store_at(recorder.endpoint(host, userinfo))
    _exercise(store)
    assert len(recorder.seen) == 6
    for seen in recorder.seen:
        assert seen.header("host") == f"{host.lower()}:{recorder.port}"
        assert signature_verifies(seen), (seen.method, seen.path, seen.headers)
    # boto3 signs the same requests the same way: the reference the fast path must match
    recorder.seen.clear()
    _exercise(store_at(recorder.endpoint(host, userinfo), fast=False))
    assert all(signature_verifies(seen) for seen in recorder.seen)


@pytest.fixture
def recorder_on_80() -> Iterator[Recorder]:
    """The recorder on the default HTTP port (the tests run as root)."""
    rec = Recorder(80)
    yield rec
    rec.close()


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:80", "http://LOCALHOST:80/"])
def test_fast_path_signs_the_host_without_the_default_port(
    recorder_on_80: Recorder, endpoint: str
) -> None:
    """``http://host:80``: the Host sent has no port (urllib3 drops the default one), so
    the signed one must not have it either."""
    store = store_at(endpoint)
    _exercise(store)
    for seen in recorder_on_80.seen:
        assert seen.header("host") == urlsplit(endpoint).hostname
        assert signature_verifies(seen), (seen.method, seen.path)


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://host:443", "https://Host.Example.COM:443/", "http://minio:80", "http://MinIO:9000",
        "http://u:p@host:9000", "https://u:p@HOST:443", "http://host:443", "https://host:80",
        "https://[::1]:443", "http://[::1]:9000", "http://[::1]", "https://s3.example.com",
    ],
)
def test_signed_host_is_botocores_for_every_endpoint_form(endpoint: str) -> None:
    """The fast path's signed Host equals botocore's (what boto3 signs and urllib3
    sends) for every spelling of an endpoint, HTTPS on its default port included."""
    from botocore.auth import _host_from_url

    wire = store_at(endpoint)._wire()
    assert wire is not None
    headers = wire._sign(_Request("HeadObject", "HEAD", "/bkt/k", (), {}, b""),
                         "")
    assert headers["host"] == _host_from_url(endpoint)


# --------------------------------------------------------- 2. credentials in the endpoint


def _no_url_password(text: str, where: str) -> None:
    assert URL_PASSWORD not in text, f"endpoint password leaked in {where}: {text[-400:]}"
    assert f"user:{URL_PASSWORD}" not in text, where


def _exception_texts(exc: BaseException) -> list[str]:
    texts = ["".join(traceback.format_exception(exc))]
    cur: BaseException | None = exc
    while cur is not None:
        texts += [str(cur), repr(cur), repr(cur.args)]
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return texts


def test_config_reprs_mask_the_endpoints_userinfo() -> None:
    endpoint = f"http://user:{URL_PASSWORD}@127.0.0.1:9000"
    config = load_config({"s3": {"endpoint_url": endpoint, "bucket_name": BUCKET}})
    assert config.s3 is not None
    for text in (repr(config), str(config), repr(config.s3), repr(config.redacted_dict())):
        _no_url_password(text, "config")
        assert "127.0.0.1:9000" in text  # still says where
    assert config.s3.endpoint_url == endpoint  # the value is there for whoever needs it
    assert config.to_dict()["s3"]["endpoint_url"] == endpoint


@PATHS
def test_store_and_queue_never_show_the_endpoints_userinfo(
    real_s3: S3Server, real_bucket: str, caplog: pytest.LogCaptureFixture, fast: bool
) -> None:
    """describe(), reprs and the "ready on ..." log of a queue whose endpoint carries
    ``user:password@`` (which the server never sees: neither boto3 nor the fast path
    sends it)."""
    caplog.set_level(logging.DEBUG)
    parts = urlsplit(real_s3.endpoint_url)
    endpoint = f"{parts.scheme}://user:{URL_PASSWORD}@{parts.netloc}"
    config = config_dict(real_s3, real_bucket, s3={"endpoint_url": endpoint, "fast_path": fast})
    pq = PawnQueue.from_config(config)
    shown = [repr(pq)]
    with pq:
        assert pq.store.fast_path is fast
        pq.create_topic("t")
        pq.register_producer("p").publish("t", {"n": 1})
        (msg,) = pq.register_consumer("c", ["t"]).poll()
        msg.ack()
        shown += [repr(pq), str(pq), repr(pq.store), pq.store.describe(), repr(pq.config)]
        assert any(parts.netloc in text for text in shown)
    for text in shown:
        _no_url_password(text, "repr")
    ready = [r.getMessage() for r in caplog.records if "ready on" in r.getMessage()]
    assert ready and parts.netloc in ready[0]
    for record in caplog.records:
        _no_url_password(record.getMessage(), f"log {record.name}")


@PATHS
def test_errors_never_show_the_endpoints_userinfo(recorder: Recorder, fast: bool) -> None:
    """An unreachable endpoint and an access denied name the endpoint, not its password."""
    port = closed_port()
    unreachable = store_at(
        f"http://user:{URL_PASSWORD}@127.0.0.1:{port}", fast=fast, connect_timeout_seconds=0.5
    )
    denied = store_at(recorder.endpoint(userinfo=f"user:{URL_PASSWORD}@"), fast=fast)
    recorder.reply = _access_denied
    for store, where in ((unreachable, f"127.0.0.1:{port}"), (denied, f":{recorder.port}")):
        with pytest.raises(StoreUnavailable) as info:
            store.put("t/k", b"{}")
        assert where in str(info.value)
        for text in _exception_texts(info.value):
            _no_url_password(text, "exception")


# --------------------------------------------------------- 3. the server's clock or none


@PATHS
def test_no_client_clock_when_the_server_gives_no_time(recorder: Recorder, fast: bool) -> None:
    """No Date header and no LastModified: the store says "unknown" (None) instead of
    the local time, which would let a client with a fast clock judge leases stale."""
    recorder.date = False
    recorder.reply = lambda seen: (
        (200, {"Content-Type": "application/xml"}, listing_xml([("t/a.lease", None)]))
        if "list-type=2" in seen.path else (200, {"ETag": '"abc"'}, b"{}")
    )
    store = store_at(recorder.endpoint(), fast=fast)
    listing = store.list("t/")
    assert [o.key for o in listing.objects] == ["t/a.lease"]
    assert listing.objects[0].last_modified is None
    assert listing.server_time is None
    assert store.server_time() is None
    assert store.head("t/a.lease").last_modified is None
    got = store.get("t/a.lease")
    assert (got.last_modified, got.server_time) == (None, None)


class _NoServerTime(MemoryStore):
    """A store that cannot tell the server's time (as S3 without a Date header)."""

    def list(self, prefix: str, **kwargs: Any) -> Any:
        return attrs.evolve(super().list(prefix, **kwargs), server_time=None)

    def server_time(self) -> Any:
        return None


def test_a_consumer_never_reaps_without_the_servers_time() -> None:
    """A lease far older than the visibility timeout, but no server time to judge it by:
    it is live, and its message is not handed to another consumer."""
    from pawn_queue_sync.clock import FakeClock

    clock = FakeClock()
    store = _NoServerTime(clock)
    config = {"polling": {"visibility_timeout_seconds": 30}}
    with PawnQueue(load_config(config), store=store, clock=clock) as pq:
        pq.create_topic("t")
        pq.register_producer("p").publish("t", {"n": 1})
        (held,) = pq.register_consumer("a", ["t"]).poll()
        clock.advance(3600)
        assert pq.register_consumer("b", ["t"]).poll() == []
        assert store.head(f"t/leases/{held.id}.lease").etag


# ------------------------------------------------------------ 4. an unreadable timestamp


@PATHS
def test_an_unreadable_last_modified_is_a_storage_error_naming_the_key(
    recorder: Recorder, fast: bool
) -> None:
    recorder.reply = lambda seen: (
        200, {"Content-Type": "application/xml"},
        listing_xml([("t/good.lease", "2026-11-26T10:00:00.000Z"), ("t/bad.lease", "soon")]),
    )
    store = store_at(recorder.endpoint(), fast=fast)
    with pytest.raises(StorageError) as info:
        store.list("t/")
    assert info.value.key == "t/bad.lease"


# --------------------------------------------------------------- 5. a closed store


@PATHS
def test_a_closed_store_stays_closed(recorder: Recorder, fast: bool) -> None:
    store = store_at(recorder.endpoint(), fast=fast)
    store.put("t/k", b"{}")
    store.close()
    sent = len(recorder.seen)
    calls: list[Callable[[], Any]] = [
        lambda: store.put("t/k", b"{}"), lambda: store.get("t/k"), lambda: store.head("t/k"),
        lambda: store.delete("t/k"), lambda: store.delete_many(["t/k"]),
        lambda: store.list("t/"), lambda: store.server_time(), lambda: store.copy("t/k", "t/j"),
    ]
    for call in calls:
        with pytest.raises(StorageError) as info:
            call()
        assert isinstance(info.value, errors.StoreClosed)
        assert isinstance(info.value, errors.NotStartedError)
        assert "closed" in str(info.value)
    assert len(recorder.seen) == sent  # nothing more was sent
    store.close()  # still idempotent
    assert "bkt" in store.describe()


# ------------------------------------------------------------------- 6. deadlines


def _run_bounded(call: Callable[[], Any], limit: float = 30.0) -> BaseException | None:
    """Run ``call`` on a thread; the exception it raised. Fails (instead of hanging)
    when it has not returned within ``limit`` seconds."""
    box: list[BaseException | None] = [None]

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            box[0] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), "the call outlived its deadline by far"
    return box[0]


def _deadline_calls(store: S3Store) -> dict[str, Callable[[float], Any]]:
    return {
        "delete": lambda d: store.delete("t/k", if_match="abc", deadline=d),
        "delete_many": lambda d: store.delete_many(["t/k", "t/j"], deadline=d),
        "put": lambda d: store.put("t/k", b"{}", if_match="abc", deadline=d),
    }


@PATHS
@pytest.mark.parametrize("op", ["delete", "delete_many", "put"])
def test_a_deadline_caps_the_wait_for_an_answer(recorder: Recorder, fast: bool, op: str) -> None:
    """A server that never answers, a read timeout of an hour and many attempts: the call
    gives up at the deadline, with DeadlineExceeded, and nothing was sent after it."""
    recorder.reply = recorder.hold
    store = store_at(recorder.endpoint(), fast=fast, read_timeout_seconds=3600.0,
                     max_attempts=5)
    deadline = time.monotonic() + 0.5
    exc = _run_bounded(lambda: _deadline_calls(store)[op](deadline))
    assert isinstance(exc, errors.DeadlineExceeded), repr(exc)
    assert isinstance(exc, StorageError) and "deadline" in str(exc)
    assert recorder.seen and all(seen.arrived < deadline for seen in recorder.seen)


@PATHS
@pytest.mark.parametrize("op", ["delete", "delete_many", "put"])
def test_no_attempt_is_sent_after_the_deadline(recorder: Recorder, fast: bool, op: str) -> None:
    """A server that answers 503 SlowDown at once, every time: botocore's standard retries
    would go on for a long while; with a deadline, the retries stop there."""
    recorder.reply = lambda seen: (
        503, {"Content-Type": "application/xml"},
        b"<Error><Code>SlowDown</Code><Message>later</Message></Error>",
    )
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=10)
    deadline = time.monotonic() + 0.3
    exc = _run_bounded(lambda: _deadline_calls(store)[op](deadline))
    assert isinstance(exc, errors.DeadlineExceeded), repr(exc)
    assert recorder.seen and all(seen.arrived < deadline for seen in recorder.seen)
    # a deadline already past sends nothing at all
    recorder.seen.clear()
    exc = _run_bounded(lambda: _deadline_calls(store)[op](time.monotonic() - 1))
    assert isinstance(exc, errors.DeadlineExceeded)
    assert recorder.seen == []


@PATHS
def test_a_deadline_far_off_changes_nothing(recorder: Recorder, fast: bool) -> None:
    store = store_at(recorder.endpoint(), fast=fast)
    far = time.monotonic() + 60
    for call in _deadline_calls(store).values():
        call(far)
    assert [seen.method for seen in recorder.seen] == ["DELETE", "POST", "PUT"]


def test_memory_and_local_stores_take_a_deadline(tmp_path: Any) -> None:
    from pawn_queue_sync.storage.local import LocalStore

    for store in (MemoryStore(), LocalStore(tmp_path)):
        store.put("t/k", b"{}", deadline=time.monotonic() + 60)
        store.delete("t/k", deadline=time.monotonic() + 60)
        assert store.delete_many(["t/k"], deadline=time.monotonic() + 60) == []
        store.put("t/k", b"{}")
        past = time.monotonic() - 1
        with pytest.raises(errors.DeadlineExceeded):
            store.delete("t/k", deadline=past)
        with pytest.raises(errors.DeadlineExceeded):
            store.delete_many(["t/k"], deadline=past)
        with pytest.raises(errors.DeadlineExceeded):
            store.put("t/k", b"[]", deadline=past)
        assert store.get("t/k").body == b"{}"  # nothing happened past the deadline


# ----------------------------------------------------------------------- 7. fork


@PATHS
def test_fork_while_another_thread_builds_the_client(recorder: Recorder, fast: bool) -> None:
    """A thread is building the store's client (holding its lock) when the process forks:
    the child builds its own client instead of waiting forever for that lock."""
    store = store_at(recorder.endpoint(), fast=fast, build=False)
    inside, release = threading.Event(), threading.Event()
    build = store._build_client

    def slow_build() -> Any:
        if os.getpid() == parent:
            inside.set()
            release.wait(30)
        return build()

    parent = os.getpid()
    store._build_client = slow_build  # type: ignore[method-assign]
    worker = threading.Thread(target=store.put, args=("t/parent", b"{}"))
    worker.start()
    try:
        assert inside.wait(30)
        code = in_child(lambda: store.put("t/child", b"{}"))
    finally:
        release.set()
        worker.join(30)
    assert code == 0
    assert {s.path.rsplit("/", 1)[-1] for s in recorder.seen if s.method == "PUT"} == {
        "child", "parent"}


def test_fork_while_another_thread_registers_secrets(recorder: Recorder) -> None:
    """The log filter's lock (taken when any store builds a client) held by another
    thread at the fork: a store built in the child still works."""
    held, release = threading.Event(), threading.Event()

    def hold_the_filter() -> None:
        with SECRET_FILTER._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_filter)
    holder.start()
    try:
        assert held.wait(30)
        code = in_child(lambda: store_at(recorder.endpoint()).put("t/child", b"{}"))
    finally:
        release.set()
        holder.join(30)
    assert code == 0


def test_fork_while_another_thread_waits_for_an_answer(recorder: Recorder) -> None:
    """A request in flight on the parent's pool at the fork: the child's requests go
    through a pool of its own."""
    arrived = threading.Event()

    def reply(seen: Seen) -> Reply:
        if seen.path.endswith("/t/parent"):
            arrived.set()
            recorder.released.wait(60)
        return _default_reply(seen)

    recorder.reply = reply
    store = store_at(recorder.endpoint())
    store.put("t/first", b"{}")  # the client exists before the fork
    worker = threading.Thread(target=lambda: _run_bounded(lambda: store.get("t/parent")))
    worker.start()
    try:
        assert arrived.wait(30)
        code = in_child(lambda: store.put("t/child", b"{}"))
    finally:
        recorder.released.set()
        worker.join(30)
    assert code == 0



def test_spark_settings_never_show_the_endpoints_userinfo() -> None:
    """What Spark writers and readers show (their reprs name the endpoint)."""
    from pawn_queue_sync.spark._common import Settings

    endpoint = f"http://user:{URL_PASSWORD}@127.0.0.1:9000"
    settings = Settings({"s3": {"endpoint_url": endpoint, "bucket_name": BUCKET}})
    for text in (settings.describe(), repr(settings)):
        _no_url_password(text, "spark settings")
        assert "127.0.0.1:9000" in text
