"""A caller's boto3 session or client, where it can go wrong: a fork while another
thread refreshes the session's credentials (the child must not inherit the held
lock), credentials that rotate (every token the store signs with is masked in the
logs, not only the first), and values that are not a session or an S3 client (a
ConfigError naming the argument, before any request)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.errors import ConfigError
from pawn_queue_sync.storage.factory import build_store
from pawn_queue_sync.storage.s3 import S3Store

from .credentials import ExpiringCredentials, keyless_config, session_of
from .forking import exit_code_of_child
from .servers import ACCESS_KEY, REGION, SECRET_KEY, S3Server, closed_port

FAST = pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "boto3"])




# ------------------------------------------------------- fork during a refresh


class _HeldRefresh(ExpiringCredentials):
    """Credentials always due for a (mandatory, locked) refresh; once ``hold`` is
    set, the next refresh stops inside the lock until ``release`` (an STS call that
    takes a while)."""

    METHOD = "test-held"

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.in_refresh = threading.Event()
        self.release = threading.Event()

    def current(self) -> dict[str, str]:
        if self.hold:
            self.hold = False  # a forked child inherits False: its refresh goes through
            self.in_refresh.set()
            self.release.wait()
        return {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}


@FAST
def test_a_fork_during_a_credential_refresh_does_not_hang_the_child(
    real_s3: S3Server, real_bucket: str, fast: bool
) -> None:
    """The parent's refreshing thread holds botocore's refresh lock at the fork; that
    thread does not exist in the child, which must still sign its requests (its own
    refresh) instead of waiting for the lock forever."""
    provider = _HeldRefresh()
    session = session_of(provider)
    store = build_store(keyless_config(real_s3, real_bucket, fast=fast), session=session)
    refresher = threading.Thread(
        target=lambda: session.get_credentials().get_frozen_credentials(), daemon=True
    )
    try:
        store.put("t/parent", b"{}")
        provider.hold = True
        refresher.start()
        assert provider.in_refresh.wait(10)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                store.put("t/child", b"{}")
                code = 0
            finally:
                os._exit(code)
        provider.release.set()
        assert exit_code_of_child(pid, limit=20) == 0  # None: blocked on the lock
        assert store.head("t/child").size == 2
    finally:
        provider.release.set()
        refresher.join(10)
        store.close()


# ------------------------------------------------------- rotating credentials


class _Tokens(ExpiringCredentials):
    """Credentials with a new key pair and session token at every refresh (each
    request: they expire within botocore's mandatory window); records all it issued."""

    METHOD = "test-tokens"

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[str] = []
        self._lock = threading.Lock()

    def current(self) -> dict[str, str]:
        with self._lock:
            n = len(self.issued) // 3 + 1
            keys = {"access_key": f"AKIAROTATING{n:08d}", "secret_key": f"rotating-secret-{n}-x",
                    "token": f"SESSIONTOKEN-SECRET-{n}-abcdef/+="}
            self.issued.extend(keys.values())
        return keys


@FAST
def test_every_credential_signed_with_is_masked_in_the_debug_log(
    moto_s3: S3Server, fast: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """botocore logs the signed request (its canonical form, its headers) at DEBUG;
    credentials refreshed after the client was built are masked there too."""
    provider = _Tokens()
    bucket = moto_s3.make_bucket()
    store = S3Store(keyless_config(moto_s3, bucket, fast=fast).s3, session=session_of(provider))
    caplog.set_level(logging.DEBUG)
    try:
        for i in range(3):
            store.put(f"k/{i}", b"{}")
        assert store.get("k/0").body == b"{}"
        store.server_time()  # boto3 on either path
    finally:
        store.close()
    text = caplog.text
    assert len(provider.issued) >= 3 * 3  # rotated: more than the first credentials
    assert "x-amz-security-token" in text.lower()  # the signed requests were logged
    leaked = [secret for secret in provider.issued if secret in text]
    assert leaked == []


# ------------------------------------------------------------------ bad values


def _config() -> Any:
    return load_config({"s3": {
        "endpoint_url": f"http://127.0.0.1:{closed_port()}", "bucket_name": "bkt",
        "aws_access_key_id": "AK", "aws_secret_access_key": "SECRETSECRET", "max_attempts": 1,
    }})


def _dynamodb() -> Any:
    return boto3.client("dynamodb", region_name=REGION, aws_access_key_id="a",
                        aws_secret_access_key="b")


def _s3_client() -> Any:
    return boto3.client("s3", region_name=REGION, aws_access_key_id="a",
                        aws_secret_access_key="b")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("session", lambda: 42, "boto3.Session"),
        ("session", _s3_client, "boto3.Session"),
        ("client", lambda: 42, "S3 client"),
        ("client", boto3.Session, "S3 client"),
        ("client", _dynamodb, "S3 client"),
    ],
    ids=["session=int", "session=client", "client=int", "client=session", "client=dynamodb"],
)
def test_a_bad_session_or_client_is_a_config_error_before_any_request(
    name: str, value: Any, expected: str
) -> None:
    """The endpoint refuses connections: a ConfigError means nothing was sent."""
    cfg = _config()
    given = {name: value()}
    for make in (lambda: PawnQueue(cfg, **given), lambda: PawnQueue.from_config(cfg, **given),
                 lambda: build_store(cfg, **given), lambda: S3Store(cfg.s3, **given)):
        with pytest.raises(ConfigError, match=f"{name}.*{expected}") as info:
            make()
        assert "SECRETSECRET" not in str(info.value)


def test_credentials_a_refresh_receives_are_masked_in_botocores_debug_log() -> None:
    """An assumed-role session refreshes through STS, and botocore.parsers logs STS's
    answer at DEBUG: the new access key, secret key and session token were in clear
    (masking knew only credentials already used to sign). A local fake STS answers."""
    script = Path(__file__).with_name("sts_refresh_log.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "leaked: []", result.stdout
