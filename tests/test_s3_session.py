"""Bring your own session: ``PawnQueue.from_config(cfg, session=boto3.Session(...))``
and ``client=`` (a ready boto3 S3 client), on the signing SeaweedFS (a wrong or
read-only identity is refused there, so these tests see whose credentials sign) and
moto: profiles from an AWS config file, refreshable credentials read again for every
request (never frozen when the store was built), and what happens across a fork and
in a pickle."""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.errors import ConfigError, StoreNotPortable, StoreUnavailable
from pawn_queue_sync.storage.factory import build_store
from pawn_queue_sync.storage.s3 import S3Store

from .credentials import ExpiringCredentials, keyless_config, session_of
from .forking import in_child
from .servers import (
    ACCESS_KEY,
    READONLY_ACCESS_KEY,
    READONLY_SECRET_KEY,
    REGION,
    SECRET_KEY,
    S3Server,
    client_config,
    config_dict,
)

FAST = pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "boto3"])


def _round_trip(pq: PawnQueue, topic: str = "jobs") -> None:
    """Publish one message and consume it (PUT, LIST, GET, DELETE signed)."""
    pq.create_topic(topic)
    pq.register_producer("p").publish(topic, {"n": 1})
    consumer = pq.register_consumer("c", [topic])
    messages = consumer.poll(max_messages=1)
    assert [m.payload for m in messages] == [{"n": 1}]
    consumer.ack(messages[0])
    assert pq.topic_stats(topic)["pending"] == 0


# ------------------------------------------------------------------ sessions


@FAST
def test_a_session_s_credentials_sign_the_requests(
    real_s3: S3Server, real_bucket: str, fast: bool
) -> None:
    """A session with the admin keys and settings without any: the queue works, on the
    fast path too, and a session with a wrong secret is refused at setup (so the
    session's credentials, not any others, are what signs)."""
    cfg = keyless_config(real_s3, real_bucket, fast=fast)
    session = boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    with PawnQueue.from_config(cfg, session=session) as pq:
        assert pq.store.fast_path is fast  # type: ignore[attr-defined]
        _round_trip(pq)
    wrong = boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key="not-the-secret")
    with pytest.raises(StoreUnavailable):
        PawnQueue.from_config(cfg, session=wrong).setup()


def test_a_read_only_session_fails_at_setup_after_an_admin_one(
    real_s3: S3Server, real_bucket: str
) -> None:
    """The probe's cached result is per identity: a read-only session's queue is
    refused at setup even in a process whose admin session probed the bucket, and its
    secret shows nowhere in the error."""
    cfg = keyless_config(real_s3, real_bucket)
    admin = boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    with PawnQueue.from_config(cfg, session=admin) as pq:
        pq.create_topic("orders")
    readonly = boto3.Session(aws_access_key_id=READONLY_ACCESS_KEY,
                             aws_secret_access_key=READONLY_SECRET_KEY)
    with pytest.raises(StoreUnavailable, match="read-only") as info:
        PawnQueue.from_config(cfg, session=readonly).setup()
    assert READONLY_SECRET_KEY not in "".join(traceback.format_exception(info.value))


@pytest.fixture
def aws_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A profile ``pq`` in an AWS config and credentials file of this test's own."""
    config = tmp_path / "config"
    config.write_text(f"[profile pq]\nregion = {REGION}\n")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[pq]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    return "pq"


def test_a_profile_session_works_on_every_server(
    s3_server: S3Server, bucket: str, aws_profile: str
) -> None:
    """``boto3.Session(profile_name=...)``: the profile's keys sign (SeaweedFS checks
    them; moto takes any), nothing about credentials in the settings."""
    cfg = keyless_config(s3_server, bucket)
    with PawnQueue.from_config(cfg, session=boto3.Session(profile_name=aws_profile)) as pq:
        _round_trip(pq)


class _Rotating(ExpiringCredentials):
    """Credentials read again at every request from ``keys`` (which a test changes)."""

    METHOD = "test-rotating"

    def __init__(self, keys: dict[str, str]) -> None:
        super().__init__()
        self.keys = keys
        self.refreshes = 0

    def current(self) -> dict[str, str]:
        self.refreshes += 1
        return self.keys


@FAST
def test_refreshable_credentials_are_read_again_not_frozen(
    real_s3: S3Server, real_bucket: str, fast: bool
) -> None:
    """Credentials that refresh (assumed roles, SSO): after they change to a read-only
    identity, writes are refused and reads still work; changed back, writes work. A
    store that froze the credentials it started with would go on writing."""
    rotating = _Rotating({"access_key": ACCESS_KEY, "secret_key": SECRET_KEY})
    session = session_of(rotating)
    store = build_store(keyless_config(real_s3, real_bucket, fast=fast), session=session)
    try:
        assert store.fast_path is fast  # type: ignore[attr-defined]
        store.put("k/1", b"{}")
        rotating.keys = {"access_key": READONLY_ACCESS_KEY, "secret_key": READONLY_SECRET_KEY}
        with pytest.raises(StoreUnavailable, match="access denied"):
            store.put("k/2", b"{}")
        assert store.get("k/1").body == b"{}"
        rotating.keys = {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
        store.put("k/2", b"{}")
        assert [o.key for o in store.list("k/").objects] == ["k/1", "k/2"]
    finally:
        store.close()


def test_a_session_store_rebuilds_its_client_in_a_forked_child(
    real_s3: S3Server, real_bucket: str
) -> None:
    """After a fork the child builds its own client from the same session (the
    parent's connections stay the parent's) and its requests are signed by it."""
    session = boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    store = build_store(keyless_config(real_s3, real_bucket), session=session)
    try:
        store.put("t/parent", b"{}")
        parent_client = store._client()  # type: ignore[attr-defined]

        def use() -> int:
            store.put("t/child", b"{}")
            return 0 if store._client() is not parent_client else 3  # type: ignore[attr-defined]

        assert in_child(use) == 0
        assert store.head("t/child").size == 2
    finally:
        store.close()


def test_a_session_store_does_not_pickle(real_s3: S3Server, real_bucket: str) -> None:
    """Its credentials live in the session, which cannot travel: a typed error, not a
    store that quietly signs with other credentials elsewhere. A store from settings
    still pickles (only its settings travel)."""
    session = boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    cfg = keyless_config(real_s3, real_bucket)
    store = S3Store(cfg.s3, session=session)
    with pytest.raises(StoreNotPortable, match="pickled"):
        pickle.dumps(store)
    plain = S3Store(load_config(config_dict(real_s3, real_bucket)).s3)
    assert pickle.loads(pickle.dumps(plain)).describe() == plain.describe()


# ------------------------------------------------------------------- clients


@pytest.fixture
def own_client(s3_server: S3Server) -> Iterator[Any]:
    client = boto3.Session().client(
        "s3", endpoint_url=s3_server.endpoint_url, region_name=REGION,
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        config=client_config(),
    )
    yield client
    client.close()


def test_a_given_client_is_used_and_left_open(
    s3_server: S3Server, bucket: str, own_client: Any
) -> None:
    """``client=``: the queue's requests go through it (its events see them, the fast
    path's too), and teardown leaves it open: it is the caller's."""
    seen: list[str] = []

    def count(request: Any, **_: Any) -> None:
        seen.append(request.method)

    own_client.meta.events.register("before-send.s3", count)
    with PawnQueue.from_config(keyless_config(s3_server, bucket), client=own_client) as pq:
        assert pq.store.fast_path  # type: ignore[attr-defined]
        _round_trip(pq)
    assert {"PUT", "GET", "DELETE"} <= set(seen)
    assert own_client.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_a_given_client_never_crosses_a_fork(
    s3_server: S3Server, bucket: str, own_client: Any
) -> None:
    """In a forked child the caller's client (its connections are the parent's) is not
    used: a typed error says to build the store in the child; the parent goes on."""
    store = build_store(keyless_config(s3_server, bucket), client=own_client)
    try:
        store.put("t/parent", b"{}")

        def use() -> int:
            try:
                store.put("t/child", b"{}")
            except StoreNotPortable:
                return 0
            return 3

        assert in_child(use) == 0
        assert [o.key for o in store.list("t/").objects] == ["t/parent"]
        with pytest.raises(StoreNotPortable):
            pickle.dumps(store)
    finally:
        store.close()


def test_session_and_client_need_an_s3_store_and_not_both(
    tmp_path: Path, own_client: Any, s3_server: S3Server, bucket: str
) -> None:
    local = load_config({"local": {"path": str(tmp_path)}})
    with pytest.raises(ConfigError):
        build_store(local, client=own_client)
    with pytest.raises(ConfigError):
        build_store(keyless_config(s3_server, bucket), session=boto3.Session(),
                    client=own_client)
