"""The chaos suite's fault-injecting proxy (:mod:`tests.fault_proxy`) in front of a real
SeaweedFS, seen through boto3 clients that do not retry, and the SeaweedFS that restarts
on its ports with its data (:class:`tests.seaweedfs.RestartableSeaweedFS`)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ReadTimeoutError,
)

from tests.fault_proxy import FaultProxy, FaultRule
from tests.seaweedfs import RestartableSeaweedFS
from tests.servers import S3Server, make_client

#: Seconds a held request or answer waits: well past the short client's read timeout.
HOLD = 2.0
SHORT_READ_TIMEOUT = 0.5


def no_retry_client(endpoint_url: str, read_timeout: float = 30.0) -> Any:
    """A boto3 client that makes one attempt per call, so every fault shows."""
    return make_client(
        endpoint_url,
        Config(
            connect_timeout=2, read_timeout=read_timeout,
            retries={"total_max_attempts": 1}, s3={"addressing_style": "path"},
        ),
    )


@pytest.fixture
def proxy(real_s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(real_s3.endpoint_url) as started:
        yield started


def exists(server: S3Server, bucket: str, key: str) -> bool:
    """Asked of the server itself, not through the proxy."""
    try:
        server.client().head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("404", "NoSuchKey")
        return False
    return True


def status_of(call: Any, **kwargs: Any) -> int:
    """The HTTP status a call got (a ClientError's too)."""
    try:
        return int(call(**kwargs)["ResponseMetadata"]["HTTPStatusCode"])
    except ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def failed_put(
    proxy: FaultProxy, bucket: str, rule: FaultRule, *, read_timeout: float = 30.0
) -> Exception:
    """Arm ``proxy`` with ``rule`` alone; what a PUT of ``k`` through it raised."""
    proxy.set_rules([rule])
    proxy.arm()
    client = no_retry_client(proxy.endpoint_url, read_timeout=read_timeout)
    with pytest.raises((ClientError, BotoCoreError)) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"v")
    return info.value


def timed_out_put(proxy: FaultProxy, bucket: str, kind: str) -> None:
    """A PUT under a fault ``kind`` that holds ``HOLD`` seconds: the client times out."""
    rule = FaultRule(kind, 1.0, delay_seconds=HOLD)  # type: ignore[arg-type]
    error = failed_put(proxy, bucket, rule, read_timeout=SHORT_READ_TIMEOUT)
    assert isinstance(error, ReadTimeoutError)


def raw_request(proxy: FaultProxy, method: str = "GET", path: str = "/b/k") -> socket.socket:
    """A socket that has sent an unsigned request to the proxy (for faults that answer
    before anything is forwarded)."""
    sock = socket.create_connection(("127.0.0.1", int(proxy.endpoint_url.rsplit(":", 1)[1])))
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
    return sock


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [("error_500", 500, "InternalError"), ("slowdown_503", 503, "SlowDown")],
)
def test_error_faults_answer_s3_xml_errors_without_forwarding(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str, kind: str, status: int, code: str
) -> None:
    error = failed_put(proxy, real_bucket, FaultRule(kind, 1.0))  # type: ignore[arg-type]
    assert isinstance(error, ClientError)
    assert error.response["Error"]["Code"] == code
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert not exists(real_s3, real_bucket, "k")
    [event] = proxy.fault_log()
    assert (event.kind, event.method, event.key, event.applied) == (kind, "PUT", "k", False)


def test_reset_closes_with_an_rst_and_forwards_nothing(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str
) -> None:
    error = failed_put(proxy, real_bucket, FaultRule("reset", 1.0))
    assert isinstance(error, ConnectionClosedError)
    assert not exists(real_s3, real_bucket, "k")
    with raw_request(proxy) as sock, pytest.raises(ConnectionResetError):
        sock.recv(1)  # an RST, not a clean end of stream
    assert [e.kind for e in proxy.fault_log()] == ["reset", "reset"]


def test_read_timeout_holds_then_closes_without_an_answer(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str
) -> None:
    timed_out_put(proxy, real_bucket, "read_timeout")
    with raw_request(proxy) as sock:
        sock.settimeout(HOLD * 10)
        assert sock.recv(1) == b""  # held, then closed: no answer at all
    assert not exists(real_s3, real_bucket, "k")
    assert all(e.applied is False for e in proxy.fault_log())


def test_drop_answer_applies_the_write_but_the_client_gets_no_answer(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str
) -> None:
    error = failed_put(proxy, real_bucket, FaultRule("drop_answer", 1.0, methods={"PUT"}))
    assert isinstance(error, ConnectionClosedError)
    assert real_s3.client().get_object(Bucket=real_bucket, Key="k")["Body"].read() == b"v"
    [event] = proxy.fault_log()
    assert (event.kind, event.applied) == ("drop_answer", True)
    # GETs pass
    client = no_retry_client(proxy.endpoint_url)
    assert client.get_object(Bucket=real_bucket, Key="k")["Body"].read() == b"v"


def test_a_request_delay_holds_it_before_the_server_sees_it(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str
) -> None:
    timed_out_put(proxy, real_bucket, "delay_request")
    assert not exists(real_s3, real_bucket, "k")  # still held
    assert proxy.wait_for(lambda: len(proxy.fault_log()) == 1, timeout=HOLD * 10)
    [event] = proxy.fault_log()
    assert (event.kind, event.delay_seconds, event.applied) == ("delay_request", HOLD, True)
    assert exists(real_s3, real_bucket, "k")  # then forwarded all the same


def test_an_answer_delay_holds_the_answer_of_an_applied_request(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str
) -> None:
    timed_out_put(proxy, real_bucket, "delay_answer")
    # the event is recorded once the server answered, before the delay
    assert proxy.wait_for(lambda: len(proxy.fault_log()) == 1, timeout=HOLD * 10)
    assert exists(real_s3, real_bucket, "k")
    # a client that waits long enough gets the answer, whole
    proxy.set_rules([FaultRule("delay_answer", 1.0, delay_seconds=0.2)])
    patient = no_retry_client(proxy.endpoint_url)
    assert patient.get_object(Bucket=real_bucket, Key="k")["Body"].read() == b"v"
    assert [e.kind for e in proxy.fault_log()] == ["delay_answer", "delay_answer"]


def head_statuses(proxy: FaultProxy, bucket: str, n: int) -> list[int]:
    client = no_retry_client(proxy.endpoint_url)
    return [status_of(client.head_object, Bucket=bucket, Key=f"k{i:02d}") for i in range(n)]


def test_the_same_seed_gives_the_same_faults(real_s3: S3Server, real_bucket: str) -> None:
    rules = [FaultRule("error_500", 0.5)]
    runs = []
    for seed in (7, 7, 8):
        with FaultProxy(real_s3.endpoint_url, rules=rules, seed=seed) as proxy:
            proxy.arm()
            statuses = head_statuses(proxy, real_bucket, 24)
            assert sorted(set(statuses)) == [404, 500]
            assert [e.key for e in proxy.fault_log()] == [
                f"k{i:02d}" for i, s in enumerate(statuses) if s == 500
            ]
            runs.append(statuses)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_max_faults_bounds_the_count(real_s3: S3Server, real_bucket: str) -> None:
    with FaultProxy(real_s3.endpoint_url, rules=[FaultRule("error_500", 1.0)], max_faults=3) as p:
        p.arm()
        assert head_statuses(p, real_bucket, 6) == [500, 500, 500, 404, 404, 404]
        assert len(p.fault_log()) == 3
        assert p.requests == 6


def test_faults_come_only_while_armed_and_within_active_seconds(
    real_s3: S3Server, real_bucket: str
) -> None:
    now = [100.0]
    with FaultProxy(
        real_s3.endpoint_url, rules=[FaultRule("error_500", 1.0)], active_seconds=1.0,
        clock=lambda: now[0],
    ) as proxy:
        client = no_retry_client(proxy.endpoint_url)

        def status() -> int:
            return status_of(client.head_object, Bucket=real_bucket, Key="k")

        assert status() == 404  # not armed yet
        proxy.arm()
        now[0] = 100.9
        assert status() == 500
        now[0] = 101.0
        assert status() == 404  # active_seconds are over
        proxy.arm()  # the clock starts again
        assert status() == 500
        proxy.disarm()
        assert status() == 404
        assert [e.t for e in proxy.fault_log()] == [100.9, 101.0]


def test_rules_match_by_method_key_prefix_list_prefix_and_condition(
    proxy: FaultProxy, real_bucket: str
) -> None:
    proxy.set_rules([
        FaultRule("error_500", 1.0, methods=frozenset({"PUT"}), prefix="w/"),
        FaultRule("slowdown_503", 1.0, prefix="c/", conditional_only=True),
        FaultRule("error_500", 1.0, methods=frozenset({"GET"}), prefix="l/"),
    ])
    proxy.arm()
    s3 = no_retry_client(proxy.endpoint_url)
    b = real_bucket
    assert status_of(s3.put_object, Bucket=b, Key="w/1", Body=b"") == 500
    assert status_of(s3.head_object, Bucket=b, Key="w/1") == 404  # not a PUT
    assert status_of(s3.put_object, Bucket=b, Key="v/w/1", Body=b"") == 200  # not the prefix
    assert status_of(s3.put_object, Bucket=b, Key="c/1", Body=b"") == 200  # unconditional
    assert status_of(s3.put_object, Bucket=b, Key="c/2", Body=b"", IfNoneMatch="*") == 503
    assert status_of(s3.list_objects_v2, Bucket=b, Prefix="l/x") == 500  # a LIST's prefix
    assert status_of(s3.list_objects_v2, Bucket=b, Prefix="m/") == 200
    assert status_of(s3.list_objects_v2, Bucket=b) == 200
    batch = {"Objects": [{"Key": "w/1"}, {"Key": "w/2"}]}
    assert status_of(s3.delete_objects, Bucket=b, Delete=batch) == 200  # not a PUT
    proxy.set_rules([FaultRule("error_500", 1.0, prefix="w/")])
    assert status_of(s3.delete_objects, Bucket=b, Delete=batch) == 500  # its first key
    assert [(e.kind, e.method, e.key) for e in proxy.fault_log()] == [
        ("error_500", "PUT", "w/1"), ("slowdown_503", "PUT", "c/2"), ("error_500", "GET", "l/x"),
        ("error_500", "POST", "w/1"),
    ]


def test_rules_are_checked() -> None:
    with pytest.raises(ValueError, match="kind"):
        FaultRule("teapot", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="probability"):
        FaultRule("reset", 1.5)
    with pytest.raises(ValueError, match="methods"):
        FaultRule("reset", 1.0, methods=frozenset({"PATCH"}))


def create_twice_at_once(proxy: FaultProxy, bucket: str, key: str) -> list[int]:
    """Two If-None-Match creates of ``key`` sent together; their statuses."""
    client = no_retry_client(proxy.endpoint_url)
    barrier = threading.Barrier(2)
    statuses = [0, 0]

    def create(i: int) -> None:
        barrier.wait()
        statuses[i] = status_of(
            client.put_object, Bucket=bucket, Key=key, Body=f"{i}".encode(), IfNoneMatch="*"
        )

    threads = [threading.Thread(target=create, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(statuses)


def test_racing_cas_lets_overlapping_creates_both_win_but_refuses_a_lone_one(
    real_s3: S3Server, real_bucket: str
) -> None:
    with FaultProxy(real_s3.endpoint_url, racing_cas=True, overlap_wait=5.0) as racy:
        assert create_twice_at_once(racy, real_bucket, "race") == [200, 200]
        assert racy.stripped == 2
        lone = no_retry_client(racy.endpoint_url, read_timeout=10)
        racy.overlap_wait = 0.2
        assert status_of(
            lone.put_object, Bucket=real_bucket, Key="race", Body=b"", IfNoneMatch="*"
        ) == 412
        assert racy.stripped == 2
        assert [e.kind for e in racy.fault_log()] == ["racing_cas", "racing_cas"]
    with FaultProxy(real_s3.endpoint_url) as honest:  # the server itself has one winner
        assert create_twice_at_once(honest, real_bucket, "fair") == [200, 412]


def test_a_client_gone_mid_answer_ends_only_its_connection(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str, capfd: pytest.CaptureFixture[str]
) -> None:
    big = b"x" * (8 << 20)
    real_s3.client().put_object(Bucket=real_bucket, Key="big", Body=big)
    url = make_client(proxy.endpoint_url).generate_presigned_url(
        "get_object", Params={"Bucket": real_bucket, "Key": "big"}
    )
    path = url.split(proxy.endpoint_url, 1)[1]
    with raw_request(proxy, path=path) as sock:
        assert sock.recv(12).startswith(b"HTTP/1.1 200")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert proxy.wait_for(lambda: proxy.open_connections == 0, timeout=30)
    client = no_retry_client(proxy.endpoint_url)
    assert client.get_object(Bucket=real_bucket, Key="big")["Body"].read() == big
    assert "Traceback" not in capfd.readouterr().err


def test_seaweedfs_restarts_on_its_endpoint_with_its_data_behind_the_proxy(
    tmp_path: Path,
) -> None:
    with RestartableSeaweedFS(tmp_path) as server:
        endpoint, first_pid = server.endpoint_url, server.pid
        with FaultProxy(endpoint) as proxy:
            client = no_retry_client(proxy.endpoint_url)
            client.create_bucket(Bucket="kept")
            client.put_object(Bucket="kept", Key="a", Body=b"before")
            for graceful in (True, False):
                server.stop(graceful=graceful)
                assert server.pid is None
                with pytest.raises(ClientError) as info:  # nothing to forward to
                    client.get_object(Bucket="kept", Key="a")
                assert info.value.response["Error"]["Code"] == "ServiceUnavailable"
                assert proxy.unreachable == (1 if graceful else 2)
                restarted = server.start_again()
                assert restarted.endpoint_url == server.endpoint_url == endpoint
                assert server.pid not in (None, first_pid)
                # the same client, through the same proxy, reconnected
                assert client.get_object(Bucket="kept", Key="a")["Body"].read() == b"before"
                client.put_object(Bucket="kept", Key=f"after-{graceful}", Body=b"")
            listed = client.list_objects_v2(Bucket="kept")["Contents"]
            assert sorted(o["Key"] for o in listed) == ["a", "after-False", "after-True"]
        assert [(start.again, start.launches >= 1) for start in server.starts] == [
            (False, True), (True, True), (True, True)
        ]
    assert server.pid is None


def test_concurrent_clients_each_get_the_answer_or_their_fault(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str
) -> None:
    """16 threads PUT under every terminal fault at once: each call fails iff a fault
    was logged for its key, and an object exists iff its PUT succeeded or only its
    answer was dropped."""
    proxy.set_rules([
        FaultRule("error_500", 0.1), FaultRule("slowdown_503", 0.1), FaultRule("reset", 0.1),
        FaultRule("read_timeout", 0.1, delay_seconds=0.05), FaultRule("drop_answer", 0.1),
        FaultRule("delay_request", 0.1, delay_seconds=0.05),
        FaultRule("delay_answer", 0.1, delay_seconds=0.05),
    ])
    proxy.arm()
    client = make_client(proxy.endpoint_url, Config(
        retries={"total_max_attempts": 1}, max_pool_connections=16,
        s3={"addressing_style": "path"},
    ))
    outcome: dict[str, bool] = {}

    def put_all(thread: int) -> None:
        for i in range(20):
            key = f"c/{thread}/{i}"
            try:
                client.put_object(Bucket=real_bucket, Key=key, Body=b"v")
                outcome[key] = True
            except (ClientError, BotoCoreError):
                outcome[key] = False

    threads = [threading.Thread(target=put_all, args=(t,)) for t in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert proxy.requests == len(outcome) == 320
    terminal = {e.key: e.kind for e in proxy.fault_log() if not e.kind.startswith("delay_")}
    assert 0 < len(terminal) < 320
    assert {k for k, ok in outcome.items() if not ok} == set(terminal)
    listed = real_s3.client().list_objects_v2(Bucket=real_bucket, Prefix="c/", MaxKeys=1000)
    stored = {o["Key"] for o in listed.get("Contents", [])}
    assert stored == {k for k, ok in outcome.items() if ok or terminal[k] == "drop_answer"}


def test_a_request_held_when_the_proxy_stops_is_never_sent(
    proxy: FaultProxy, real_s3: S3Server, real_bucket: str
) -> None:
    timed_out_put(proxy, real_bucket, "delay_request")
    proxy.stop()  # cuts the delay short, and waits for the connection's thread
    assert proxy.open_connections == 0
    [event] = proxy.fault_log()
    assert (event.kind, event.applied) == ("delay_request", False)
    assert not exists(real_s3, real_bucket, "k")
