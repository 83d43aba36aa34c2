"""``StorageError.transient``: an outage (no answer, a server error after every retry) is
transient, a refusal (bucket missing, credentials wrong) is not, on the fast path and on
boto3's, at setup as a worker pool's child meets it (workers.pool restarts a child that
met the first and counts the second as a failed start)."""

from __future__ import annotations

import socket

import pytest

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.errors import StorageError
from tests.fault_proxy import FaultProxy, FaultRule
from tests.servers import S3Server, config_dict

FAST = pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "boto3"])


def _setup_error(cfg: dict) -> StorageError:
    with pytest.raises(StorageError) as caught:
        PawnQueue.from_config(cfg).setup()
    return caught.value


def _quick(cfg: dict, fast_path: bool) -> dict:
    cfg["s3"].update(fast_path=fast_path, max_attempts=2, connect_timeout_seconds=1.0,
                     read_timeout_seconds=2.0)
    return cfg


@FAST
def test_a_server_that_answers_503_to_everything_is_an_outage(
    real_s3: S3Server, real_bucket: str, fast_path: bool
) -> None:
    with FaultProxy(real_s3.endpoint_url, rules=[FaultRule("slowdown_503", 1.0)]) as proxy:
        proxy.arm()
        cfg = _quick(config_dict(real_s3, real_bucket), fast_path)
        cfg["s3"]["endpoint_url"] = proxy.endpoint_url
        error = _setup_error(cfg)
    assert error.transient, repr(error)


@FAST
def test_no_server_at_the_endpoint_is_an_outage(
    real_s3: S3Server, real_bucket: str, fast_path: bool
) -> None:
    with socket.socket() as s:  # a port nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        cfg = _quick(config_dict(real_s3, real_bucket), fast_path)
        cfg["s3"]["endpoint_url"] = f"http://127.0.0.1:{port}"
        error = _setup_error(cfg)
    assert error.transient, repr(error)


@FAST
def test_a_missing_bucket_is_not_an_outage(real_s3: S3Server, fast_path: bool) -> None:
    cfg = _quick(config_dict(real_s3, "no-such-bucket-transient"), fast_path)
    error = _setup_error(cfg)
    assert "does not exist" in str(error)
    assert not error.transient, repr(error)


@FAST
def test_a_wrong_secret_is_not_an_outage(
    real_s3: S3Server, real_bucket: str, fast_path: bool
) -> None:
    cfg = _quick(config_dict(real_s3, real_bucket), fast_path)
    cfg["s3"]["aws_secret_access_key"] = "wrong-secret-for-this-test"
    error = _setup_error(cfg)
    assert not error.transient, repr(error)
    assert "wrong-secret-for-this-test" not in str(error)
