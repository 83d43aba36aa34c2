"""Tests of the test infrastructure: servers, fixtures, environment, pawn-queue interop."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests import interop
from tests.conftest import SCRUBBED_ENV_PREFIXES
from tests.seaweedfs import start_seaweedfs
from tests.servers import (
    S3Server,
    config_dict,
    deep_merge,
    start_moto,
    unique_bucket_name,
)

PINNED_IMDS = "AWS_EC2_METADATA_DISABLED"
REPO = Path(__file__).resolve().parents[1]
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


def _error(exc: ClientError) -> tuple[int, str]:
    """Return (HTTP status, error code) of a ClientError."""
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def _port_open(url: str) -> bool:
    """Return whether something accepts TCP connections at *url*'s host:port."""
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


# ------------------------------------------------------------------ no server


def test_environment_is_scrubbed() -> None:
    leaked = [
        name
        for name in os.environ
        if name.startswith(SCRUBBED_ENV_PREFIXES)
        and name not in {"AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", PINNED_IMDS}
    ]
    assert leaked == []
    assert os.environ["AWS_CONFIG_FILE"] == os.devnull
    assert os.environ[PINNED_IMDS] == "true"


def test_session_scrubs_a_developer_environment(tmp_path: Path) -> None:
    """Run a tiny session with the conftest as a plugin and leaky variables set."""
    inner = tmp_path / "test_inner.py"
    inner.write_text(
        "import os\n"
        "def test_inner():\n"
        "    for name in ('AWS_ACCESS_KEY_ID', 'AWS_PROFILE', 'PAWNQUEUE_S3_BUCKET_NAME'):\n"
        "        assert name not in os.environ, name\n"
    )
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID="leak",
        AWS_PROFILE="leak",
        PAWNQUEUE_S3_BUCKET_NAME="leak",
    )
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-p", "tests.conftest", "--rootdir", str(tmp_path), str(inner)),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def test_monkeypatch_can_still_set_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAWNQUEUE_S3_BUCKET_NAME", "from-env")
    assert os.environ["PAWNQUEUE_S3_BUCKET_NAME"] == "from-env"


def test_unique_bucket_names_are_valid_and_distinct() -> None:
    names = {unique_bucket_name("q") for _ in range(1000)}
    assert len(names) == 1000
    assert all(BUCKET_RE.match(n) and n.startswith("q-") for n in names)
    with pytest.raises(ValueError):
        unique_bucket_name("Bad_Prefix")


def test_config_dict_deep_merges_and_copies() -> None:
    server = S3Server("fake", "http://127.0.0.1:1", lambda: None)
    polling = {"interval_seconds": 0.1}
    cfg = config_dict(server, "b1", polling=polling, s3={"use_ssl": True})
    assert cfg == {
        "s3": {
            "endpoint_url": "http://127.0.0.1:1",
            "bucket_name": "b1",
            "aws_access_key_id": "test",
            "aws_secret_access_key": "test",
            "region_name": "us-east-1",
            "use_ssl": True,
        },
        "polling": {"interval_seconds": 0.1},
    }
    cfg["polling"]["interval_seconds"] = 9
    assert polling == {"interval_seconds": 0.1}  # the override was copied, not shared
    assert config_dict(server, "b1")["s3"]["use_ssl"] is False


def test_deep_merge_leaves_inputs_alone() -> None:
    base: dict[str, Any] = {"a": {"b": 1, "c": [1]}, "d": 1}
    merged = deep_merge(base, {"a": {"b": 2}, "e": {"f": 1}})
    assert merged == {"a": {"b": 2, "c": [1]}, "d": 1, "e": {"f": 1}}
    merged["a"]["c"].append(2)
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


# ------------------------------------------------------------------ both servers


def test_fixture_wiring(s3_server: S3Server, bucket: str, s3_config: dict[str, Any]) -> None:
    assert s3_server.name in {"seaweedfs", "moto"}
    assert s3_server.endpoint_url.startswith("http://127.0.0.1:")
    assert s3_config["s3"]["bucket_name"] == bucket
    assert s3_config["s3"]["endpoint_url"] == s3_server.endpoint_url
    s3_server.client().head_bucket(Bucket=bucket)  # raises if the bucket doesn't exist


def test_if_none_match_star_and_listing(s3_server: S3Server, bucket: str) -> None:
    s3 = s3_server.client()
    s3.put_object(Bucket=bucket, Key="q/lease", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        s3.put_object(Bucket=bucket, Key="q/lease", Body=b"second", IfNoneMatch="*")
    assert _error(info.value) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=bucket, Key="q/lease")["Body"].read() == b"first"

    for key in ("q/b", "q/a", "r/c"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="q/")
    assert [o["Key"] for o in listed["Contents"]] == ["q/a", "q/b", "q/lease"]
    assert listed["KeyCount"] == 3


def test_fresh_bucket_per_test(s3_server: S3Server, bucket: str) -> None:
    assert s3_server.client().list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    other = s3_server.make_bucket()
    assert other != bucket
    s3_server.client().put_object(Bucket=other, Key="k", Body=b"v")
    s3_server.remove_bucket(other)
    with pytest.raises(ClientError) as info:
        s3_server.client().head_bucket(Bucket=other)
    assert _error(info.value)[0] == 404


def test_missing_bucket_is_no_such_bucket(s3_server: S3Server) -> None:
    # SeaweedFS by default answers AccessDenied here (auto-create); start_seaweedfs turns
    # that off so both servers behave like AWS.
    with pytest.raises(ClientError) as info:
        s3_server.client().put_object(Bucket=unique_bucket_name("nope"), Key="k", Body=b"v")
    assert _error(info.value) == (404, "NoSuchBucket")


# ------------------------------------------------------------------ SeaweedFS only


def test_real_s3_is_seaweedfs(real_s3: S3Server, seaweedfs: S3Server) -> None:
    assert real_s3 is seaweedfs
    assert real_s3.name == "seaweedfs"
    assert real_s3.log_path is not None and real_s3.log_path.is_file()


def test_seaweedfs_honours_copy_conditions(real_s3: S3Server, real_bucket: str) -> None:
    """The reason ``real_s3`` exists: moto ignores CopyObject conditions."""
    s3 = real_s3.client()
    s3.put_object(Bucket=real_bucket, Key="src", Body=b"src")
    s3.put_object(Bucket=real_bucket, Key="dst", Body=b"dst")
    with pytest.raises(ClientError) as info:
        s3.copy_object(
            Bucket=real_bucket,
            Key="dst",
            CopySource={"Bucket": real_bucket, "Key": "src"},
            IfNoneMatch="*",
        )
    assert _error(info.value)[0] == 412
    assert s3.get_object(Bucket=real_bucket, Key="dst")["Body"].read() == b"dst"


@pytest.mark.slow
def test_seaweedfs_start_and_stop_leave_nothing_behind(tmp_path: Path) -> None:
    server = start_seaweedfs(tmp_path)
    try:
        assert server.pid is not None
        name = server.make_bucket()
        server.client().put_object(Bucket=name, Key="k", Body=b"v")
        assert _port_open(server.endpoint_url)
    finally:
        server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(server.pid, 0)
    assert not _port_open(server.endpoint_url)
    server.stop()  # idempotent


def test_moto_start_and_stop() -> None:
    server = start_moto()
    try:
        assert server.name == "moto"
        name = server.make_bucket()
        server.client().put_object(Bucket=name, Key="k", Body=b"v")
    finally:
        server.stop()
    assert not _port_open(server.endpoint_url)


def test_moto_conditional_creates_race_with_one_winner(
    moto_s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto checks If-None-Match, then writes, without a lock (two winners were seen
    under load); tests.servers makes its conditional requests one step. The check is
    slowed down here so that, without that lock, every racer would pass it."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from moto.s3.models import S3Backend

    name = moto_s3.make_bucket()
    s3 = moto_s3.client()
    key = "race/one-winner"
    plain = S3Backend.get_object

    def slow_get_object(self: Any, bucket_name: str, key_name: str, *a: Any, **kw: Any) -> Any:
        found = plain(self, bucket_name, key_name, *a, **kw)
        if key_name == key:
            time.sleep(0.05)  # widen the window between the check and the write
        return found

    monkeypatch.setattr(S3Backend, "get_object", slow_get_object)
    racers = 6
    barrier = threading.Barrier(racers)

    def create(i: int) -> bool:
        barrier.wait()
        try:
            s3.put_object(Bucket=name, Key=key, Body=f"racer {i}".encode(), IfNoneMatch="*")
        except ClientError as exc:
            assert _error(exc) == (412, "PreconditionFailed")
            return False
        return True

    with ThreadPoolExecutor(racers) as pool:
        won = [i for i, ok in enumerate(pool.map(create, range(racers))) if ok]
    assert len(won) == 1, won
    body = s3.get_object(Bucket=name, Key=key)["Body"].read()
    assert body == f"racer {won[0]}".encode()


# ------------------------------------------------------------------ interop


@pytest.mark.interop
def test_pawnqueue_runs_in_its_own_venv() -> None:
    python = interop.pawnqueue_python()
    assert python.is_file()
    assert Path(sys.prefix).resolve() not in python.resolve().parents
    result = interop.run_pawnqueue(
        "import sys, botocore, pawn_queue\n"
        "import importlib.metadata as md\n"
        "emit({'pq': md.version('pawn-queue'), 'botocore': botocore.__version__,\n"
        "      'prefix': sys.prefix, 'bucket': CONFIG['s3']['bucket_name'], 'args': ARGS})\n",
        {"s3": {"bucket_name": "cfg-check"}},
        args={"n": 1},
    )
    assert result["pq"] == "0.1.3"
    assert result["botocore"] == "1.40.61"
    assert Path(result["prefix"]).resolve() != Path(sys.prefix).resolve()
    assert result["bucket"] == "cfg-check"
    assert result["args"] == {"n": 1}
    # ... and it is not importable here.
    with pytest.raises(ImportError):
        __import__("pawn_queue")


@pytest.mark.interop
def test_run_pawnqueue_reports_failures() -> None:
    with pytest.raises(interop.InteropError, match="boom-from-script"):
        interop.run_pawnqueue("raise SystemExit('boom-from-script')", {})
    with pytest.raises(interop.InteropError, match="JSON"):
        interop.run_pawnqueue("print('not json')", {})


@pytest.mark.interop
def test_pawnqueue_publish_consume_round_trip(real_s3: S3Server, real_bucket: str) -> None:
    config = config_dict(real_s3, real_bucket)
    topic = f"interop-{uuid.uuid4().hex[:8]}"
    payloads = [{"n": n, "text": f"héllo {n}"} for n in range(5)]

    ids = interop.pawnqueue_publish(config, topic, payloads)
    assert len(ids) == len(set(ids)) == 5
    # Independent evidence the messages are on the server, in pawn-queue's layout.
    listed = real_s3.client().list_objects_v2(Bucket=real_bucket, Prefix=f"{topic}/messages/")
    assert listed["KeyCount"] == 5

    got = interop.pawnqueue_consume(config, topic, max_messages=5)
    assert [m["id"] for m in got] == ids  # FIFO by time-prefixed key
    assert [m["payload"] for m in got] == payloads
    assert all(m["producer_id"] and m["created_at"] for m in got)
    assert interop.pawnqueue_consume(config, topic, max_messages=1, empty_polls=1) == []
    listed = real_s3.client().list_objects_v2(Bucket=real_bucket, Prefix=f"{topic}/messages/")
    assert listed["KeyCount"] == 0  # acked: deleted
