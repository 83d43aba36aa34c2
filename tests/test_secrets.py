"""Credentials never show: not in reprs, error messages, tracebacks or logs.

The access key and secret below are fake but distinctive (and include characters that
need quoting or escaping somewhere), so any leak is found by a plain substring search.
SeaweedFS in the tests checks signatures and knows them as an admin identity
(tests/servers.py); moto accepts any credentials.
"""

from __future__ import annotations

import logging
import pickle
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from pawn_queue_sync import (
    ConfigError,
    PawnQueue,
    PawnQueueBuilder,
    PawnQueueError,
    StoreUnavailable,
    load_config,
)
from tests.servers import (
    LEAK_CHECK_ACCESS_KEY,
    LEAK_CHECK_SECRET_KEY,
    S3Server,
    closed_port,
    config_dict,
    deep_merge,
)

ACCESS_KEY = LEAK_CHECK_ACCESS_KEY
SECRET_KEY = LEAK_CHECK_SECRET_KEY
SECRETS = (ACCESS_KEY, SECRET_KEY)


def secret_config(server: S3Server, bucket: str, **overrides: Any) -> dict[str, Any]:
    base = config_dict(server, bucket)
    base["s3"]["aws_access_key_id"] = ACCESS_KEY
    base["s3"]["aws_secret_access_key"] = SECRET_KEY
    return deep_merge(base, overrides)


def assert_no_secret(text: str, where: str = "") -> None:
    for secret in SECRETS:
        assert secret not in text, f"credential leaked in {where}: ...{text[-300:]}"
    # the secret with its JSON/repr escaping, should something encode it first
    assert SECRET_KEY.replace("/", "\\/") not in text, where


def exception_texts(exc: BaseException) -> Iterator[tuple[str, str]]:
    """Every way an exception is commonly shown: str, repr, args, the formatted traceback,
    and the same for each exception of the chain Python shows (``__cause__``, and
    ``__context__`` unless suppressed by ``raise ... from None``)."""
    yield "traceback", "".join(traceback.format_exception(exc))
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        name = type(cur).__name__
        yield f"{name} str", str(cur)
        yield f"{name} repr", repr(cur)
        yield f"{name} args", repr(cur.args)
        todo.append(cur.__cause__)
        if not cur.__suppress_context__:
            todo.append(cur.__context__)


def assert_exception_clean(exc: BaseException) -> None:
    assert isinstance(exc, PawnQueueError)
    for where, text in exception_texts(exc):
        assert_no_secret(text, where)


# --------------------------------------------------------------------------- reprs


def test_config_and_builder_never_show_credentials(tmp_path: Path) -> None:
    data = {
        "s3": {
            "endpoint_url": "http://127.0.0.1:9",
            "bucket_name": "secret-check",
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
        }
    }
    config = load_config(data)
    built = (
        PawnQueueBuilder()
        .s3(
            endpoint_url="http://127.0.0.1:9",
            bucket_name="secret-check",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
        )
        .build_config()
    )
    assert built == config
    for shown in (repr(config), str(config), repr(config.s3), str(config.s3)):
        assert_no_secret(shown, "config repr")
    assert_no_secret(repr(config.redacted_dict()), "redacted_dict")
    assert config.s3 is not None
    # ...but the values are there for whoever needs them
    assert (config.s3.aws_access_key_id, config.s3.aws_secret_access_key) == SECRETS
    assert pickle.loads(pickle.dumps(config)) == config  # picklable for child processes

    # configuration errors about or near a credential do not echo it
    for bad in (
        {"s3": {**data["s3"], "aws_secret_access_key": None}},
        {"s3": {**data["s3"], "aws_access_key_id": ""}},
        {"s3": {**data["s3"], "aws_access_key_id": 12345}},
        {"s3": {**data["s3"], "endpoint_url": f"ftp://{ACCESS_KEY}:{SECRET_KEY}@host"}},
        {"s3": {**data["s3"], "bucket_name": "Bad_Bucket"}},
        {"s3": {**data["s3"], "aws_secret_key": SECRET_KEY}},  # a typo'd key name
    ):
        with pytest.raises(ConfigError) as info:
            load_config(bad)
        assert_exception_clean(info.value)
    yaml_file = tmp_path / "config.yaml"
    yaml_file.write_text(
        f"s3:\n  bucket_name: b-1\n  aws_access_key_id: {ACCESS_KEY}\n"
        f'  aws_secret_access_key: "{SECRET_KEY}\n  region_name: [\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(yaml_file)
    assert_exception_clean(info.value)


def test_queue_store_and_roles_never_show_credentials(s3_server: S3Server, bucket: str) -> None:
    pq = PawnQueue.from_config(secret_config(s3_server, bucket))
    assert_no_secret(repr(pq), "PawnQueue before setup")
    with pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        producer.publish("t", {"n": 1})
        consumer = pq.register_consumer("c", ["t"])
        (msg,) = consumer.poll()
        shown = [
            repr(pq),
            str(pq),
            repr(pq.store),
            pq.store.describe(),
            repr(pq.config),
            repr(pq.context),
            repr(producer),
            repr(consumer),
            repr(msg),
            repr(pq.list_registrations()),
            repr(pq.context.caps),
        ]
        # a store travels to other processes by its configuration, not a live client
        shown.append(repr(pickle.loads(pickle.dumps(pq.store))))
        msg.ack()
    shown.append(repr(pq))
    for text in shown:
        assert_no_secret(text, "repr")


# --------------------------------------------------------------------------- errors


def test_errors_with_fake_credentials_do_not_show_them(s3_server: S3Server) -> None:
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    port = closed_port()
    cases = {
        # case -> (configuration, what the message must still say)
        "missing bucket": (secret_config(s3_server, missing), missing),
        "unreachable": (
            secret_config(
                s3_server,
                missing,
                s3={
                    "endpoint_url": f"http://127.0.0.1:{port}",
                    "max_attempts": 1,
                    "connect_timeout_seconds": 0.5,
                },
            ),
            f"127.0.0.1:{port}",
        ),
    }
    for case, (config, expected) in cases.items():
        with pytest.raises(StoreUnavailable) as info:
            PawnQueue.from_config(config).setup()
        assert_exception_clean(info.value)
        assert expected in str(info.value), case


@pytest.mark.parametrize(
    "bad_key",
    [f"{ACCESS_KEY}\n", f"{ACCESS_KEY}\r\nX-Injected: 1"],
    ids=["trailing-newline", "crlf"],
)
def test_malformed_credentials_fail_without_echoing_them(
    s3_server: S3Server, bucket: str, bad_key: str
) -> None:
    """Credentials that cannot be put in a header (a key read from a file with its
    newline, say): the HTTP library's error quotes the header, escaped, so the
    translated error must not carry it along."""
    config = secret_config(s3_server, bucket, s3={"aws_access_key_id": bad_key, "max_attempts": 1})
    with pytest.raises(PawnQueueError) as info:
        PawnQueue.from_config(config).setup()
    assert_exception_clean(info.value)


# --------------------------------------------------------------------------- logs


def test_no_credentials_in_logs_during_a_full_cycle(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything, botocore included
    config = secret_config(s3_server, bucket)
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        producer.publish_batch("t", [{"n": n} for n in range(3)])
        # a foreign object and a malformed message: the warnings they cause are logged too
        pq.store.put("t/messages/foreign.txt", b"x")
        consumer = pq.register_consumer("c", ["t"])
        got = consumer.poll()
        got[0].nack("logged reason")
        for msg in got[1:]:
            msg.ack()
        assert len(got) == 3
    with pytest.raises(StoreUnavailable):
        PawnQueue.from_config(secret_config(s3_server, f"missing-{uuid.uuid4().hex[:12]}")).setup()

    records = caplog.records
    ours = [r for r in records if r.name.startswith("pawn_queue_sync")]
    assert ours, "the library logged nothing at DEBUG: the check below would be empty"
    assert any("foreign" in r.getMessage() for r in ours)
    for record in records:
        text = f"{record.getMessage()} {record.exc_text or ''} {record.stack_info or ''}"
        if record.exc_info and record.exc_info[1] is not None:
            text += "".join(traceback.format_exception(record.exc_info[1]))
        # Neither credential appears anywhere, whoever logs: botocore logs the signed
        # request headers at DEBUG (Authorization: ... Credential=<key id>/...), and the
        # S3 store masks our credentials in botocore's records too.
        assert SECRET_KEY not in text, record.name
        assert ACCESS_KEY not in text, record.name
    assert any("***" in r.getMessage() for r in records if r.name.startswith("botocore")), (
        "botocore logged no masked header: the check above may be vacuous"
    )


# --------------------------------------------------------------------------- endpoint URL

URL_SECRET = "pqSync-Url-Pa55word-LEAK"


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "boto3"])
def test_credentials_inside_the_endpoint_url_never_show(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture, fast_path: bool
) -> None:
    """``http://user:password@host:port``: neither path sends the userinfo, and no repr,
    log line (botocore's at DEBUG included) or error shows it."""
    caplog.set_level(logging.DEBUG)
    parts = urlsplit(s3_server.endpoint_url)
    endpoint = f"{parts.scheme}://pq-user:{URL_SECRET}@{parts.netloc}"
    config = secret_config(s3_server, bucket, s3={"endpoint_url": endpoint,
                                                  "fast_path": fast_path})
    shown: list[str] = []
    with PawnQueue.from_config(config) as pq:
        assert pq.store.fast_path is fast_path
        pq.create_topic("t")
        pq.register_producer("p").publish("t", {"n": 1})
        (msg,) = pq.register_consumer("c", ["t"]).poll()
        msg.ack()
        shown += [repr(pq), pq.store.describe(), repr(pq.config), repr(pq.config.redacted_dict())]
    unreachable = secret_config(s3_server, bucket, s3={
        "endpoint_url": f"http://pq-user:{URL_SECRET}@127.0.0.1:{closed_port()}",
        "fast_path": fast_path, "max_attempts": 1, "connect_timeout_seconds": 0.5,
    })
    with pytest.raises(StoreUnavailable) as info:
        PawnQueue.from_config(unreachable).setup()
    shown += [text for _, text in exception_texts(info.value)]
    shown += [r.getMessage() for r in caplog.records]
    assert any(parts.netloc in text for text in shown)
    for text in shown:
        assert URL_SECRET not in text
