"""Our SigV4, checked by a server that checks it: SeaweedFS started with identities
(see tests/servers.py), on the boto3 path and on the fast path alike.

A wrong secret really fails (so a passing request proves its signature), read-only
credentials fail at the first write with a typed error that says so, awkward keys
round-trip, and endpoints with an upper-case host or userinfo sign correctly.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError

from pawn_queue_sync import PawnQueue, StoreUnavailable, layout
from pawn_queue_sync.config import S3Config
from pawn_queue_sync.storage.s3 import S3Store
from tests.servers import (
    ACCESS_KEY,
    SECRET_KEY,
    S3Server,
    config_dict,
    make_client,
)

#: Distinctive, so a leak is a plain substring; never valid on the server.
WRONG_SECRET = "WRONG+secret/pqs-0123456789abcdefXYZ"

PATHS = pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "boto3"])

#: Keys whose encoding differs between careless and careful signers.
AWKWARD_KEYS = [
    "with space/and more spaces.json",
    "unicode/ключ-ü-é-漢字.json",
    "plus+sign/a+b.json",
    "percent%/100%25done.json",
    "tilde~/~home~.json",
    "mixed/ ~+%=&;,@$!*'()[] é",
]


def s3_store(
    server: S3Server, bucket: str, *, fast_path: bool, **over: Any
) -> S3Store:
    settings = config_dict(
        server, bucket, s3={"max_attempts": 2, "fast_path": fast_path, **over}
    )["s3"]
    store = S3Store(S3Config(**settings))
    assert store.fast_path is fast_path  # the path under test is the one taken
    return store


@pytest.fixture
def checked(real_s3: S3Server) -> S3Server:
    """SeaweedFS, which must check signatures for these tests to mean anything."""
    assert real_s3.checks_signatures and real_s3.readonly is not None
    return real_s3


def all_texts(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc.args)


# --------------------------------------------------------------------------- wrong secret


def test_the_server_refuses_a_wrong_secret(checked: S3Server, real_bucket: str) -> None:
    """The premise of this file: a request signed with a wrong secret fails."""
    wrong = make_client(checked.endpoint_url, access_key=ACCESS_KEY, secret_key=WRONG_SECRET)
    with pytest.raises(ClientError) as info:
        wrong.put_object(Bucket=real_bucket, Key="k", Body=b"x")
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    checked.client().put_object(Bucket=real_bucket, Key="k", Body=b"x")  # right secret: fine


@PATHS
def test_a_wrong_secret_is_store_unavailable_naming_the_credentials(
    checked: S3Server, real_bucket: str, fast_path: bool
) -> None:
    config = config_dict(
        checked, real_bucket, s3={"aws_secret_access_key": WRONG_SECRET, "fast_path": fast_path}
    )
    with pytest.raises(StoreUnavailable) as info:
        PawnQueue.from_config(config).setup()
    assert "credentials" in str(info.value)
    assert WRONG_SECRET not in all_texts(info.value)

    store = s3_store(checked, real_bucket, fast_path=fast_path, aws_secret_access_key=WRONG_SECRET)
    try:
        for call in (
            lambda: store.put("k.json", b"{}"),
            lambda: store.get("k.json"),
            lambda: store.list(""),
            lambda: store.delete("k.json"),
        ):
            with pytest.raises(StoreUnavailable) as info:
                call()
            assert "credentials" in str(info.value)
            assert WRONG_SECRET not in all_texts(info.value)
    finally:
        store.close()
    assert checked.client().list_objects_v2(Bucket=real_bucket).get("KeyCount", 0) == 0


# ------------------------------------------------------------------------ read-only


@PATHS
def test_read_only_credentials_fail_at_setup_saying_so(
    checked: S3Server, real_bucket: str, fast_path: bool
) -> None:
    assert checked.readonly is not None
    key, secret = checked.readonly
    config = config_dict(
        checked, real_bucket,
        s3={"aws_access_key_id": key, "aws_secret_access_key": secret, "fast_path": fast_path},
    )
    pq = PawnQueue.from_config(config)
    with pytest.raises(StoreUnavailable) as info:
        pq.setup()  # its probe is the first write
    text = str(info.value)
    assert "access denied" in text and "read-only" in text
    assert secret not in all_texts(info.value)
    assert checked.client().list_objects_v2(Bucket=real_bucket).get("KeyCount", 0) == 0

    # the store itself: reads work, the first write is refused with a typed error
    checked.client().put_object(Bucket=real_bucket, Key="there.json", Body=b"{}")
    store = s3_store(
        checked, real_bucket, fast_path=fast_path,
        aws_access_key_id=key, aws_secret_access_key=secret,
    )
    try:
        assert store.get("there.json").body == b"{}"
        assert [o.key for o in store.list("").objects] == ["there.json"]
        with pytest.raises(StoreUnavailable, match="access denied"):
            store.put("new.json", b"{}")
        with pytest.raises(StoreUnavailable, match="access denied"):
            store.delete("there.json")
    finally:
        store.close()


# ----------------------------------------------------------------------- awkward keys


@PATHS
def test_awkward_keys_round_trip_with_signatures_checked(
    checked: S3Server, real_bucket: str, fast_path: bool
) -> None:
    store = s3_store(checked, real_bucket, fast_path=fast_path)
    try:
        written = {}
        for i, key in enumerate(AWKWARD_KEYS):
            body = f'{{"i":{i}}}'.encode()
            written[key] = store.put(key, body).etag
            assert store.get(key).body == body
            assert store.head(key).etag == written[key]
            # conditional requests sign their headers too
            with pytest.raises(Exception, match="condition failed"):
                store.put(key, body, if_none_match=True)
        listed = store.list("")
        assert {o.key: o.etag for o in listed.objects} == written
        for key in AWKWARD_KEYS:  # each listed under its own prefix, exactly
            prefix = key.split("/")[0] + "/"
            assert [o.key for o in store.list(prefix).objects] == [key]
        # and the server agrees on the names (not only our own decoding)
        raw = checked.client().list_objects_v2(Bucket=real_bucket)
        assert sorted(o["Key"] for o in raw["Contents"]) == sorted(AWKWARD_KEYS)
        first, *rest = AWKWARD_KEYS
        store.delete(first, if_match=written[first])
        assert store.delete_many(rest) == []
        assert store.list("").objects == []
    finally:
        store.close()


# ------------------------------------------------------------------------- endpoints


def _endpoints(server: S3Server) -> dict[str, str]:
    port = urlsplit(server.endpoint_url).port
    return {
        "upper-case-host": f"http://LOCALHOST:{port}",
        "userinfo": f"http://u:p@127.0.0.1:{port}",
    }


@pytest.fixture(params=["upper-case-host", "userinfo"])
def odd_endpoint(request: pytest.FixtureRequest, checked: S3Server) -> Iterator[str]:
    yield _endpoints(checked)[request.param]


@PATHS
def test_odd_endpoints_sign_correctly(
    checked: S3Server, real_bucket: str, odd_endpoint: str, fast_path: bool
) -> None:
    store = s3_store(checked, real_bucket, fast_path=fast_path, endpoint_url=odd_endpoint)
    try:
        key = "odd/endpoint.json"
        etag = store.put(key, b'{"a":1}').etag
        assert store.get(key).body == b'{"a":1}'
        assert [o.key for o in store.list("odd/").objects] == [key]
        store.delete(key, if_match=etag)
        assert store.list("").objects == []
    finally:
        store.close()
    config = config_dict(
        checked, real_bucket, s3={"endpoint_url": odd_endpoint, "fast_path": fast_path}
    )
    with PawnQueue.from_config(config) as pq:
        assert pq.strategy == "conditional_write"
        pq.create_topic("t")
        pq.register_producer("p").publish("t", {"n": 1})
        got = pq.register_consumer("c", ["t"]).poll()
        assert [m.payload for m in got] == [{"n": 1}]
        got[0].ack()
        assert "u:p@" not in repr(pq) and "u:p@" not in pq.store.describe()
    assert [
        o["Key"]
        for o in checked.client().list_objects_v2(Bucket=real_bucket).get("Contents", [])
        if o["Key"].startswith(layout.PROBE_PREFIX)
    ] == []


def test_the_admin_credentials_are_what_the_fixtures_use(real_s3: S3Server) -> None:
    assert (real_s3.access_key, real_s3.secret_key) == (ACCESS_KEY, SECRET_KEY)


def test_read_only_credentials_fail_at_setup_after_admin_ones_probed_the_bucket(
    checked: S3Server, real_bucket: str
) -> None:
    """The probe's result was cached per endpoint and bucket only: read-only credentials
    in a process whose admin queue had probed the bucket passed setup and failed later."""
    with PawnQueue.from_config(config_dict(checked, real_bucket)) as admin:
        admin.create_topic("orders")
    assert checked.readonly is not None
    key, secret = checked.readonly
    config = config_dict(checked, real_bucket,
                         s3={"aws_access_key_id": key, "aws_secret_access_key": secret})
    with pytest.raises(StoreUnavailable, match="read-only"):
        PawnQueue.from_config(config).setup()
