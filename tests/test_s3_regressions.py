"""Regressions of the S3 store (``storage/s3/``), each against
what reaches a server: a loopback HTTP server records every request (method, path,
headers, body, arrival) and answers as told, so a test sees exactly what was sent and
can make the server answer what real servers rarely do (no Date, no LastModified, a
bad timestamp, access denied, no answer at all).

1. the fast path signs the Host header it sends (every endpoint spelling);
2. credentials inside ``endpoint_url`` never show;
3. no client clock stands in for the server's;
4. an unreadable LastModified is a StorageError naming the key;

A closed store, deadlines and forks are in test_s3_lifecycle.py.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.errors import StorageError, StoreUnavailable
from pawn_queue_sync.storage.memory import MemoryStore
from pawn_queue_sync.storage.s3 import S3Store
from pawn_queue_sync.storage.s3.wire import _Request

from .s3_recorder import (
    ACCESS_KEY,
    BUCKET,
    PATHS,
    REGION,
    SECRET_KEY,
    URL_PASSWORD,
    Recorder,
    Seen,
    access_denied,
    listing_xml,
    recording,
    store_at,
)
from .servers import S3Server, closed_port, config_dict

recorder = pytest.fixture(recording, name="recorder")


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


@pytest.mark.xdist_group("port-80")  # one listener on port 80 at a time
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
    recorder.reply = access_denied
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


def test_spark_settings_never_show_the_endpoints_userinfo() -> None:
    """What Spark writers and readers show (their reprs name the endpoint)."""
    from pawn_queue_sync.spark.settings import Settings

    endpoint = f"http://user:{URL_PASSWORD}@127.0.0.1:9000"
    settings = Settings({"s3": {"endpoint_url": endpoint, "bucket_name": BUCKET}})
    for text in (settings.describe(), repr(settings)):
        _no_url_password(text, "spark settings")
        assert "127.0.0.1:9000" in text
