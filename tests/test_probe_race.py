"""The capability probe races: a server whose conditional writes break only under
concurrency is caught, and the result is cached per store for the process.

The server is SeaweedFS behind :class:`tests.racy_proxy.RacyProxy`: honest, it forwards
everything; racy, it drops If-None-Match / If-Match while two requests for one key
overlap (as a SeaweedFS release did, issue 8800) and keeps them on a lone request, so a
sequential probe sees a perfect server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue, ProbeError, StoreUnavailable, layout
from pawn_queue_sync.protocol import probe as probe_mod
from pawn_queue_sync.storage.memory import MemoryStore
from tests.racy_proxy import RacyProxy
from tests.servers import (
    LEAK_CHECK_ACCESS_KEY,
    LEAK_CHECK_SECRET_KEY,
    S3Server,
    config_dict,
)

#: Every probe request is a PUT or DELETE of a _probe/ key (plus none else).
RACE_PUTS = probe_mod.ROUNDS * probe_mod.RACERS * 2


@pytest.fixture
def honest(real_s3: S3Server) -> Iterator[RacyProxy]:
    with RacyProxy(real_s3.endpoint_url, strip_overlapping=False) as proxy:
        yield proxy


@pytest.fixture
def racy(real_s3: S3Server) -> Iterator[RacyProxy]:
    with RacyProxy(
        real_s3.endpoint_url,
        strip_overlapping=True,
        access_key=LEAK_CHECK_ACCESS_KEY,
        secret_key=LEAK_CHECK_SECRET_KEY,
    ) as proxy:
        yield proxy


def proxied(
    proxy: RacyProxy, server: S3Server, bucket: str, *, fast_path: bool = True, **over: Any
) -> dict[str, Any]:
    """The config of ``bucket`` reached through ``proxy``, with the leak-check
    credentials (an admin identity on SeaweedFS), so any leak is a plain substring."""
    s3 = {
        "endpoint_url": proxy.endpoint_url,
        "fast_path": fast_path,
        "aws_access_key_id": LEAK_CHECK_ACCESS_KEY,
        "aws_secret_access_key": LEAK_CHECK_SECRET_KEY,
    }
    return config_dict(server, bucket, s3=s3, **over)


def probe_objects(server: S3Server, bucket: str) -> list[str]:
    """The scratch objects left in ``bucket`` (asked of the server itself)."""
    listed = server.client().list_objects_v2(Bucket=bucket, Prefix=layout.PROBE_PREFIX)
    return [o["Key"] for o in listed.get("Contents", [])]


def probe_path(bucket: str) -> str:
    return f"/{bucket}/{layout.PROBE_PREFIX}"


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "boto3"])
def test_an_honest_server_passes_the_racing_probe(
    honest: RacyProxy, real_s3: S3Server, real_bucket: str, fast_path: bool
) -> None:
    with PawnQueue.from_config(proxied(honest, real_s3, real_bucket, fast_path=fast_path)) as pq:
        assert pq.strategy == "conditional_write"
        assert pq.context.caps.if_match is True
    # the probe raced: every round's creates and updates went out, and nothing stays
    assert honest.count(probe_path(real_bucket), "PUT") >= RACE_PUTS
    assert honest.stripped == 0
    assert honest.overlapped >= 1  # the requests of a race really were in flight together
    assert probe_objects(real_s3, real_bucket) == []


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "boto3"])
def test_auto_falls_back_to_csprng_verify_with_a_warning_on_a_racy_server(
    racy: RacyProxy,
    real_s3: S3Server,
    real_bucket: str,
    fast_path: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pawn_queue_sync")
    with PawnQueue.from_config(proxied(racy, real_s3, real_bucket, fast_path=fast_path)) as pq:
        assert pq.strategy == "csprng_verify"
        assert pq.context.caps.if_none_match is False
        # and the queue works on it, with the fallback strategy
        pq.create_topic("t")
        pq.register_producer("p").publish("t", {"n": 1})
        got = pq.register_consumer("c", ["t"]).poll()
        assert [m.payload for m in got] == [{"n": 1}]
        got[0].ack()
    assert racy.stripped >= 2  # the proxy did break the races
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = "\n".join(r.getMessage() for r in warnings)
    assert racy.endpoint_url in text and real_bucket in text  # names the server
    assert "If-None-Match" in text and "concurrent creates" in text
    assert "csprng_verify" in text
    assert LEAK_CHECK_SECRET_KEY not in text and LEAK_CHECK_ACCESS_KEY not in text
    assert probe_objects(real_s3, real_bucket) == []


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "boto3"])
def test_explicit_conditional_write_on_a_racy_server_is_a_probe_error(
    racy: RacyProxy, real_s3: S3Server, real_bucket: str, fast_path: bool
) -> None:
    config = proxied(
        racy, real_s3, real_bucket, fast_path=fast_path,
        concurrency={"strategy": "conditional_write"},
    )
    pq = PawnQueue.from_config(config)
    with pytest.raises(ProbeError) as info:
        pq.setup()
    text = str(info.value)
    assert "If-None-Match" in text and "concurrent creates of one new key" in text
    assert racy.endpoint_url in text
    assert LEAK_CHECK_SECRET_KEY not in text and LEAK_CHECK_ACCESS_KEY not in text
    assert probe_objects(real_s3, real_bucket) == []


def test_a_second_queue_on_the_same_store_does_not_probe_again(
    honest: RacyProxy, real_s3: S3Server, real_bucket: str
) -> None:
    config = proxied(honest, real_s3, real_bucket)
    with PawnQueue.from_config(config) as first:
        assert first.strategy == "conditional_write"
    probed = honest.count(probe_path(real_bucket))
    assert probed >= RACE_PUTS
    with PawnQueue.from_config(config) as second, PawnQueue.from_config(
        {**config, "concurrency": {"strategy": "conditional_write"}}
    ) as third:
        assert second.strategy == third.strategy == "conditional_write"
    assert honest.count(probe_path(real_bucket)) == probed  # no request for the probe
    # another bucket on the same server is another store: probed on its own
    other = real_s3.make_bucket()
    try:
        with PawnQueue.from_config(proxied(honest, real_s3, other)):
            pass
        assert honest.count(probe_path(other)) >= RACE_PUTS
    finally:
        real_s3.remove_bucket(other)


def test_a_racy_result_is_cached_too_and_each_queue_warns(
    racy: RacyProxy, real_s3: S3Server, real_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = proxied(racy, real_s3, real_bucket)
    with PawnQueue.from_config(config) as pq:
        assert pq.strategy == "csprng_verify"
    probed = racy.count(probe_path(real_bucket))
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="pawn_queue_sync")
    with PawnQueue.from_config(config) as pq:
        assert pq.strategy == "csprng_verify"
    assert racy.count(probe_path(real_bucket)) == probed
    assert any("falling back to csprng_verify" in r.getMessage() for r in caplog.records)
    with pytest.raises(ProbeError):
        PawnQueue.from_config({**config, "concurrency": {"strategy": "conditional_write"}}).setup()


# --------------------------------------------------------------------------- pure logic


class RacyMemory(MemoryStore):
    """A MemoryStore whose creates all succeed while ``racers`` of them overlap: the
    first conditional PUT of a key waits (an event) for the others, then all drop
    their condition."""

    def __init__(self, racers: int) -> None:
        super().__init__()
        import threading

        self._racers = racers
        self._arrived: dict[str, int] = {}
        self._cond = threading.Condition()

    def put(self, key: str, body: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> Any:
        if if_none_match:
            with self._cond:
                self._arrived[key] = self._arrived.get(key, 0) + 1
                self._cond.notify_all()
                overlapping = self._cond.wait_for(
                    lambda: self._arrived[key] >= self._racers, timeout=0.2
                )
            if overlapping:
                return super().put(key, body)
        return super().put(key, body, if_none_match=if_none_match, if_match=if_match)


def test_the_probe_reports_each_failed_round_and_removes_its_objects() -> None:
    store = RacyMemory(probe_mod.RACERS)
    report = probe_mod.probe(store)
    assert report.if_none_match is False
    assert report.if_match is True
    assert len(report.failures) == probe_mod.ROUNDS
    assert all(f"{probe_mod.RACERS} of {probe_mod.RACERS}" in f for f in report.failures)
    assert store.list("").objects == []
    honest = MemoryStore()
    assert probe_mod.probe(honest) == probe_mod.ProbeReport((), ())
    assert honest.list("").objects == []


def test_a_denied_write_is_store_unavailable_saying_so_and_nothing_is_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    def deny(op: str, key: str) -> None:
        calls.append(op)
        if op in ("put", "delete"):
            raise StoreUnavailable("put_object: access denied by s3:x/b (AccessDenied)")

    store = MemoryStore(hooks=deny)
    with pytest.raises(StoreUnavailable, match="read-only credentials") as info:
        PawnQueue(store=store).setup()
    assert "access denied" in str(info.value)
    assert store.list("").objects == []
    # nothing was written, so nothing is deleted (read-only credentials could not)
    assert "delete" not in calls
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_unreachable_store_mid_probe_is_not_called_access_denied() -> None:
    def down(op: str, key: str) -> None:
        if op == "put":
            raise StoreUnavailable("put_object failed: ConnectTimeoutError")

    with pytest.raises(StoreUnavailable) as info:
        PawnQueue(store=MemoryStore(hooks=down)).setup()
    assert "ConnectTimeoutError" in str(info.value)
    assert "access denied" not in str(info.value) and "read-only" not in str(info.value)


def test_userinfo_is_redacted_from_what_the_probe_says() -> None:
    assert probe_mod.redact("s3:http://u:p@127.0.0.1:9/b") == "s3:http://***@127.0.0.1:9/b"
    assert probe_mod.redact("s3:https://host/b") == "s3:https://host/b"
