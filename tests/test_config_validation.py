"""Tests for pawn_queue_sync.config: validation, secrecy, round trips."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync.config import (
    ENV_VARS,
    SECRET_FIELDS,
    ConcurrencyConfig,
    CsprngVerifyConfig,
    LocalConfig,
    PawnQueueConfig,
    PollingConfig,
    PublishingConfig,
    RegistryConfig,
    S3Config,
    load_config,
)
from pawn_queue_sync.errors import ConfigError
from tests.config_cases import ACCESS, S3_DICT, SECRET, clean_environ, full_config, write


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environ(monkeypatch)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"polling": {"intervall_seconds": 1}}, "polling.intervall_seconds"),
        ({"pollling": {}}, "pollling"),
        (
            {"concurrency": {"csprng_verify": {"jitter_min": 1}}},
            "concurrency.csprng_verify.jitter_min",
        ),
        ({"s3": {"bucket_name": "abc", "secret_key": "x"}}, "s3.secret_key"),
        ({"polling": {"interval_seconds": {"x": 1}}}, "polling.interval_seconds"),
    ],
)
def test_unknown_key(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data, env={})
    assert info.value.field == field


def test_unknown_key_suggests_and_lists_all() -> None:
    with pytest.raises(ConfigError, match="did you mean 'interval_seconds'") as info:
        load_config({"polling": {"intervall_seconds": 1, "zzz": 2}}, env={})
    assert "polling.zzz" in str(info.value)


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, "registry:\n  heartbeat: 3\n")
    with pytest.raises(ConfigError, match=r"^registry\.heartbeat: unknown key") as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"polling": {"interval_seconds": "5"}}, "polling.interval_seconds"),
        ({"polling": {"interval_seconds": True}}, "polling.interval_seconds"),
        ({"polling": {"interval_seconds": 0}}, "polling.interval_seconds"),
        ({"polling": {"interval_seconds": float("nan")}}, "polling.interval_seconds"),
        ({"polling": {"max_messages_per_poll": 2.5}}, "polling.max_messages_per_poll"),
        ({"polling": {"max_messages_per_poll": 0}}, "polling.max_messages_per_poll"),
        ({"polling": {"claim_threads": None}}, "polling.claim_threads"),
        ({"polling": {"jitter_max_ms": -1}}, "polling.jitter_max_ms"),
        ({"s3": {"bucket_name": "abc", "use_ssl": "yes"}}, "s3.use_ssl"),
        ({"s3": {"bucket_name": "abc", "max_pool_connections": 0}}, "s3.max_pool_connections"),
        ({"s3": {"bucket_name": "abc", "addressing_style": "dns"}}, "s3.addressing_style"),
        ({"s3": {"bucket_name": "abc", "endpoint_url": "localhost:9000"}}, "s3.endpoint_url"),
        ({"s3": {"bucket_name": "abc", "region_name": ""}}, "s3.region_name"),
        ({"s3": {"bucket_name": 123}}, "s3.bucket_name"),
        ({"s3": ["bucket"]}, "s3"),
        ({"local": {"fsync": 1}}, "local.fsync"),
        ({"local": {"path": ""}}, "local.path"),
        ({"concurrency": {"strategy": "optimistic"}}, "concurrency.strategy"),
        ({"concurrency": {"csprng_verify": 3}}, "concurrency.csprng_verify"),
        ({"registry": {"heartbeat_interval_seconds": -1}}, "registry.heartbeat_interval_seconds"),
        ({"publishing": {"max_payload_bytes": "1MB"}}, "publishing.max_payload_bytes"),
        ({"publishing": {"batch_threads": 0}}, "publishing.batch_threads"),
        ({"publishing": {"max_segment_messages": 0}}, "publishing.max_segment_messages"),
        ({"publishing": {"max_segment_messages": 100001}}, "publishing.max_segment_messages"),
        ({"publishing": {"linger_ms": -1}}, "publishing.linger_ms"),
        ({"publishing": {"linger_ms": 10001}}, "publishing.linger_ms"),
        ({"publishing": {"linger_ms": 1.5}}, "publishing.linger_ms"),
        ({"publishing": {"max_segment_bytes": 1052671}}, "publishing.max_segment_bytes"),
        (
            {"publishing": {"max_payload_bytes": 10000, "max_segment_bytes": 14095}},
            "publishing.max_segment_bytes",
        ),
    ],
)
def test_bad_values(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data, env={})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_the_default_segment_limit_follows_a_larger_payload_limit() -> None:
    """A configuration that raised max_payload_bytes to 8 MiB or more (plain topics) is
    still accepted: the default max_segment_bytes grows to fit one such message (it was
    refused over a packed-only setting the user never set)."""
    for payload in (8 * 2**20, 16 * 2**20):
        cfg = load_config({"publishing": {"max_payload_bytes": payload}}, env={})
        assert cfg.publishing.max_segment_bytes == payload + 4096
    small = load_config({"publishing": {"max_payload_bytes": 1000}}, env={})
    assert small.publishing.max_segment_bytes == 8 * 2**20


def test_segment_limits_take_their_bounds() -> None:
    """The packed-topic limits accept their bounds (the bad values above are one past)."""
    cfg = load_config(
        {
            "publishing": {
                "max_payload_bytes": 10000,
                "max_segment_bytes": 14096,
                "max_segment_messages": 100000,
                "linger_ms": 0,
            }
        },
        env={},
    )
    assert (cfg.publishing.max_segment_bytes, cfg.publishing.linger_ms) == (14096, 0)
    assert load_config({"publishing": {"linger_ms": 10000}}, env={}).publishing.linger_ms == 10000


def test_error_message_format() -> None:
    with pytest.raises(ConfigError, match=r"^polling\.interval_seconds: must be > 0"):
        load_config({"polling": {"interval_seconds": 0}}, env={})
    with pytest.raises(ConfigError, match=r"^polling\.interval_seconds: must be > 0"):
        PollingConfig(interval_seconds=-1)


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("PAWNQUEUE_POLLING_INTERVAL_SECONDS", "fast", "polling.interval_seconds"),
        ("PAWNQUEUE_POLLING_MAX_MESSAGES_PER_POLL", "2.5", "polling.max_messages_per_poll"),
        ("PAWNQUEUE_CSPRNG_VERIFY_RETRIES", "two", "concurrency.csprng_verify.verify_retries"),
        ("PAWNQUEUE_CONCURRENCY_STRATEGY", "fastest", "concurrency.strategy"),
        ("PAWNQUEUE_POLLING_CLAIM_THREADS", "0", "polling.claim_threads"),
    ],
)
def test_bad_env_values(name: str, value: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={name: value})
    assert info.value.field == field
    assert name in str(info.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("Yes", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("NO", False),
    ],
)
def test_env_bools(raw: str, expected: bool) -> None:
    env = {"PAWNQUEUE_S3_BUCKET_NAME": "abc", "PAWNQUEUE_S3_USE_SSL": raw}
    cfg = load_config(env=env)
    assert cfg.s3 is not None and cfg.s3.use_ssl is expected
    env = {"PAWNQUEUE_S3_BUCKET_NAME": "abc", "PAWNQUEUE_S3_CREATE_BUCKET": raw}
    cfg = load_config(env=env)
    assert cfg.s3 is not None and cfg.s3.create_bucket is expected


@pytest.mark.parametrize("raw", ["maybe", "on", "2", "tru"])
def test_env_bad_bool(raw: str) -> None:
    env = {"PAWNQUEUE_S3_BUCKET_NAME": "abc", "PAWNQUEUE_S3_USE_SSL": raw}
    with pytest.raises(ConfigError, match="PAWNQUEUE_S3_USE_SSL") as info:
        load_config(env=env)
    assert info.value.field == "s3.use_ssl"


@pytest.mark.parametrize("refresh", [30, 31, 100.5])
def test_lease_refresh_must_be_below_visibility(refresh: float) -> None:
    data = {
        "polling": {"visibility_timeout_seconds": 30, "lease_refresh_interval_seconds": refresh}
    }
    with pytest.raises(ConfigError, match="visibility_timeout_seconds") as info:
        load_config(data, env={})
    assert info.value.field == "polling.lease_refresh_interval_seconds"


def test_lease_refresh_below_visibility_is_fine() -> None:
    data = {"polling": {"visibility_timeout_seconds": 30, "lease_refresh_interval_seconds": 29.9}}
    assert load_config(data, env={}).polling.lease_refresh_interval_seconds == 29.9


def test_lease_check_across_sources() -> None:
    """A file visibility and an env refresh are checked together after merging."""
    env = {"PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": "5"}
    with pytest.raises(ConfigError) as info:
        load_config(env=env)  # default refresh 10 >= 5
    assert info.value.field == "polling.lease_refresh_interval_seconds"


def test_csprng_jitter_min_above_max() -> None:
    data = {"concurrency": {"csprng_verify": {"jitter_min_ms": 500, "jitter_max_ms": 400}}}
    with pytest.raises(ConfigError, match="jitter_min_ms") as info:
        load_config(data, env={})
    assert info.value.field == "concurrency.csprng_verify.jitter_max_ms"
    ok = {"concurrency": {"csprng_verify": {"jitter_min_ms": 400, "jitter_max_ms": 400}}}
    assert load_config(ok, env={}).concurrency.csprng_verify.jitter_min_ms == 400


@pytest.mark.parametrize(
    ("data", "env"),
    [
        ({"s3": {"endpoint_url": "http://localhost:9000"}}, {}),
        ({"s3": {}}, {}),
        (None, {"PAWNQUEUE_S3_ENDPOINT_URL": "http://localhost:9000"}),
        (None, {"PAWNQUEUE_S3_USE_SSL": "false"}),
    ],
)
def test_bucket_required_when_s3_present(data: dict[str, Any] | None, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"^s3\.bucket_name: required") as info:
        load_config(data, env=env)
    assert info.value.field == "s3.bucket_name"


@pytest.mark.parametrize(
    "name", ["ab", "a" * 64, "My-Bucket", "under_score", "-leading", "trailing.", "dots..x"]
)
def test_bad_bucket_names(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"s3": {"bucket_name": name}}, env={})
    assert info.value.field == "s3.bucket_name"


@pytest.mark.parametrize("name", ["abc", "a" * 63, "my.bucket-1", "0numeric9"])
def test_good_bucket_names(name: str) -> None:
    cfg = load_config({"s3": {"bucket_name": name}}, env={})
    assert cfg.s3 is not None and cfg.s3.bucket_name == name


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"aws_access_key_id": ACCESS}, "s3.aws_secret_access_key"),
        ({"aws_secret_access_key": SECRET}, "s3.aws_access_key_id"),
    ],
)
def test_credentials_both_or_neither(given: dict[str, str], missing: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"s3": {"bucket_name": "abc", **given}}, env={})
    assert info.value.field == missing
    assert ACCESS not in str(info.value) and SECRET not in str(info.value)


# --------------------------------------------------------------------------- secrecy


def test_secrets_not_in_repr_or_str() -> None:
    cfg = full_config()
    assert cfg.s3 is not None
    assert cfg.s3.aws_secret_access_key == SECRET  # really configured
    for text in (repr(cfg), str(cfg), repr(cfg.s3), str(cfg.s3)):
        assert SECRET not in text
        assert ACCESS not in text
        assert "***" in text
    assert "bucket_name='pawnqueue'" in repr(cfg.s3)  # the rest is still shown


def test_unset_secrets_shown_as_none() -> None:
    s3 = S3Config(bucket_name="abc")
    assert "aws_secret_access_key=None" in repr(s3)


@pytest.mark.parametrize("field", sorted(SECRET_FIELDS))
def test_secret_of_wrong_type_not_echoed(field: str) -> None:
    leaf = field.split(".")[-1]
    value = 98765432123456789
    with pytest.raises(ConfigError) as info:
        load_config({"s3": {"bucket_name": "abc", **S3_DICT, leaf: value}}, env={})
    assert info.value.field == field
    assert str(value) not in str(info.value)


def test_errors_on_other_fields_do_not_leak_secrets() -> None:
    env = {"PAWNQUEUE_S3_SECRET_KEY": SECRET, "PAWNQUEUE_S3_ACCESS_KEY": ACCESS}
    with pytest.raises(ConfigError) as info:
        load_config({"s3": {"bucket_name": "BAD_NAME"}}, env=env)
    assert info.value.field == "s3.bucket_name"
    assert SECRET not in str(info.value) and ACCESS not in str(info.value)


def test_redacted_dict() -> None:
    cfg = full_config()
    red = cfg.redacted_dict()
    assert red["s3"]["aws_secret_access_key"] == "***"
    assert red["s3"]["aws_access_key_id"] == "***"
    assert red["s3"]["bucket_name"] == "pawnqueue"
    assert SECRET not in str(red) and ACCESS not in str(red)
    assert cfg.to_dict()["s3"]["aws_secret_access_key"] == SECRET  # to_dict untouched
    assert load_config(env={}).redacted_dict()["s3"] is None


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "obj",
    [
        full_config(),
        PawnQueueConfig(),
        S3Config(bucket_name="abc", aws_access_key_id=ACCESS, aws_secret_access_key=SECRET),
        LocalConfig(path="/x", fsync=False),
        PollingConfig(claim_threads=1),
        CsprngVerifyConfig(jitter_min_ms=1),
        ConcurrencyConfig(strategy="csprng_verify"),
        RegistryConfig(heartbeat_interval_seconds=1.5),
        PublishingConfig(batch_threads=1),
    ],
    ids=lambda o: type(o).__name__,
)
def test_pickle_round_trip(obj: object) -> None:
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(obj, protocol=protocol))
        assert clone == obj
        assert type(clone) is type(obj)
        assert clone is not obj


def test_to_dict_round_trip() -> None:
    cfg = full_config()
    data = cfg.to_dict()
    assert data["s3"]["aws_secret_access_key"] == SECRET  # secrets included on purpose
    assert data["polling"]["claim_threads"] == 4
    # Every field is explicit, so a different environment cannot change it.
    env = {name: "1" for name in ENV_VARS.values()}
    env["PAWNQUEUE_S3_BUCKET_NAME"] = "other-bucket"
    env["PAWNQUEUE_CONCURRENCY_STRATEGY"] = "auto"
    env["PAWNQUEUE_LOCAL_PATH"] = "/elsewhere"
    env["PAWNQUEUE_S3_ENDPOINT_URL"] = "http://other:1"
    assert load_config(data, env=env) == cfg
    assert load_config(data, env={}) == cfg


def test_to_dict_round_trip_local_backend() -> None:
    cfg = load_config({"polling": {"claim_threads": 2}}, env={})
    data = cfg.to_dict()
    assert data["s3"] is None
    back = load_config(data, env={"PAWNQUEUE_S3_BUCKET_NAME": "envbucket"})
    assert back == cfg
    assert back.backend == "local"


def test_to_dict_is_yaml_loadable(tmp_path: Path) -> None:
    import yaml

    cfg = full_config()
    path = write(tmp_path, yaml.safe_dump(cfg.to_dict()))
    assert load_config(path, env={}) == cfg
