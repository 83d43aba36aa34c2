"""The S3 store's fast path (``storage/s3/fast.py``, ``wire.py``) on real servers, beyond the shared
store contract (which runs it as ``seaweedfs`` and boto3 alone as ``seaweedfs-boto3``):
keys that need escaping, credentials from the environment, when it stands aside for
boto3, the events it emits, retries, and its error texts."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from pawn_queue_sync.config import S3Config
from pawn_queue_sync.errors import ConditionFailed, ObjectNotFound, StoreUnavailable
from pawn_queue_sync.storage.s3 import S3Store

from .servers import ACCESS_KEY, SECRET_KEY, S3Server, closed_port

#: keys a queue never makes but a shared bucket may hold: every byte class SigV4 and
#: the URL must escape alike
ODD_KEYS = [
    "odd/with space.json",
    "odd/plus+and=equals&amp.json",
    "odd/unicodé-ключ-鍵.json",
    "odd/percent%20literal.json",
    "odd/tilde~star*quote'paren(x).json",
    "odd/colon:semicolon;comma,at@.json",
]


def _store(server: S3Server, bucket: str, **overrides: Any) -> S3Store:
    values: dict[str, Any] = {
        "endpoint_url": server.endpoint_url,
        "bucket_name": bucket,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "use_ssl": False,
    }
    values.update(overrides)
    return S3Store(S3Config(**values))


@pytest.fixture
def fast(s3_server: S3Server, bucket: str) -> Iterator[S3Store]:
    store = _store(s3_server, bucket)
    assert store.fast_path
    yield store
    store.close()


def test_odd_keys_round_trip_and_list_back_exactly(fast: S3Store, s3_server: S3Server,
                                                    bucket: str) -> None:
    for i, key in enumerate(ODD_KEYS):
        fast.put(key, f'{{"n": {i}}}'.encode())
    listed = [o.key for o in fast.list("odd/").objects]
    assert sorted(listed) == sorted(ODD_KEYS)
    # boto3 sees the very same keys and bodies: nothing was mangled on the way in
    plain = _store(s3_server, bucket, fast_path=False)
    for i, key in enumerate(ODD_KEYS):
        assert fast.get(key).body == plain.get(key).body == f'{{"n": {i}}}'.encode()
        assert fast.head(key).etag == plain.head(key).etag
    assert sorted(o.key for o in plain.list("odd/").objects) == sorted(ODD_KEYS)
    assert fast.delete_many(ODD_KEYS[:3]) == []
    fast.delete(ODD_KEYS[3])
    assert sorted(o.key for o in plain.list("odd/").objects) == sorted(ODD_KEYS[4:])


def test_common_prefixes_and_pages(fast: S3Store) -> None:
    keys = [f"p/{d}/k{i:04d}" for d in ("a b", "c+d") for i in range(3)] + [
        f"p/k{i:04d}" for i in range(1200)
    ]
    batch = {k: b"{}" for k in keys}
    for key, body in batch.items():
        fast.put(key, body)
    listing = fast.list("p/", delimiter="/")
    assert sorted(listing.prefixes) == ["p/a b/", "p/c+d/"]
    assert len(listing.objects) == 1200  # two pages of at most 1,000
    limited = fast.list("p/k", limit=1001)
    assert len(limited.objects) == 1001 and limited.truncated
    assert fast.delete_many(keys) == []
    assert fast.list("p/").objects == []


def test_conditions_and_missing_keys(fast: S3Store) -> None:
    first = fast.put("c/k", b"1", if_none_match=True)
    with pytest.raises(ConditionFailed):
        fast.put("c/k", b"2", if_none_match=True)
    with pytest.raises(ConditionFailed):
        fast.put("c/k", b"2", if_match="0" * 32)
    second = fast.put("c/k", b"2", if_match=first.etag)
    assert second.etag != first.etag and second.server_time is not None
    with pytest.raises(ObjectNotFound):
        fast.get("c/missing")
    with pytest.raises(ObjectNotFound):
        fast.head("c/missing")
    fast.delete("c/missing")  # a missing key is fine without a condition
    fast.delete("c/k", if_match=second.etag)
    with pytest.raises(ObjectNotFound):
        fast.head("c/k")


def test_credentials_from_the_environment(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    store = _store(s3_server, bucket, aws_access_key_id=None, aws_secret_access_key=None)
    assert store.fast_path
    store.put("env/k", b"{}")
    assert store.get("env/k").body == b"{}"


@pytest.mark.parametrize(
    ("overrides", "env"),
    [
        ({"fast_path": False}, {}),
        ({"addressing_style": "virtual"}, {}),
        ({}, {"HTTP_PROXY": "http://127.0.0.1:9"}),
    ],
    ids=["switched-off", "virtual-addressing", "proxy"],
)
def test_boto3_sends_everything_where_the_fast_path_does_not_apply(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, Any], env: dict[str, str],
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = _store(s3_server, bucket, **overrides)
    assert not store.fast_path
    if not env:  # (behind the fake proxy nothing would answer)
        store.put("b/k", b"{}")
        assert store.get("b/k").body == b"{}"
    assert not _store(s3_server, bucket, endpoint_url=None, region_name="eu-west-1").fast_path


def test_events_count_every_request_and_a_hook_may_answer(fast: S3Store) -> None:
    """botocore's ``before-send`` contract: counters see each request (the benchmarks
    count this way), and a handler's answer replaces the network (moto's mock_aws)."""
    seen: Counter[str] = Counter()
    statuses: list[int] = []
    events = fast._client().meta.events

    def count(event_name: str, **_: Any) -> None:
        seen[event_name.rsplit(".", 1)[-1]] += 1

    def status(http_response: Any, **_: Any) -> None:
        statuses.append(http_response.status_code)

    events.register("before-send.s3", count)
    events.register("after-send.s3", status)
    fast.put("e/k", b"{}")
    fast.get("e/k")
    with pytest.raises(ObjectNotFound):
        fast.head("e/none")
    fast.list("e/")
    fast.delete_many(["e/k"])
    assert seen == Counter(
        {"PutObject": 1, "GetObject": 1, "HeadObject": 1, "ListObjectsV2": 1, "DeleteObjects": 1}
    )
    assert statuses == [200, 200, 404, 200, 200]

    class Canned:
        status_code = 200
        headers = {"ETag": '"abc"', "Content-Length": "2"}
        content = b"{}"

    def answer(request: Any, **_: Any) -> Any:
        return Canned() if request.url.endswith("/mocked") else None

    events.register("before-send.s3.GetObject", answer)
    got = fast.get("mocked")
    assert (got.body, got.etag) == (b"{}", "abc")


def test_retries_server_errors_then_gives_up_with_a_clear_error(fast: S3Store) -> None:
    calls = Counter[str]()
    lock = threading.Lock()

    class Busy:
        status_code = 503
        headers: dict[str, str] = {}
        content = b"<Error><Code>SlowDown</Code><Message>later</Message></Error>"

    def busy(request: Any, event_name: str, **_: Any) -> Any:
        with lock:
            calls[event_name] += 1
            return Busy() if calls[event_name] <= 2 else None

    events = fast._client().meta.events
    events.register("before-send.s3.PutObject", busy)
    fast.put("r/k", b"{}")  # two 503s, then through: botocore's standard retries
    assert calls["before-send.s3.PutObject"] == 3
    assert fast.get("r/k").body == b"{}"


def test_unreachable_endpoint_names_it_and_nothing_else() -> None:
    unused_port = closed_port()
    store = S3Store(
        S3Config(
            endpoint_url=f"http://127.0.0.1:{unused_port}",
            bucket_name="nowhere",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            use_ssl=False,
            max_attempts=1,
            connect_timeout_seconds=0.5,
        )
    )
    assert store.fast_path
    with pytest.raises(StoreUnavailable) as info:
        store.put("k", b"{}")
    assert f"127.0.0.1:{unused_port}" in str(info.value)
    assert SECRET_KEY not in str(info.value)
