"""Tests for pawn_queue_sync.config: defaults, sources (YAML, dict, environment), precedence.

The builder, the schema and the environment table: test_config_builder.py; validation,
secrecy and round trips: test_config_validation.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import attrs
import pytest

from pawn_queue_sync.config import (
    CsprngVerifyConfig,
    LocalConfig,
    PawnQueueConfig,
    PollingConfig,
    PublishingConfig,
    load_config,
)
from pawn_queue_sync.errors import ConfigError
from tests.config_cases import ACCESS, S3_DICT, SECRET, clean_environ, full_config, write


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environ(monkeypatch)


# --------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    cfg = load_config(env={})
    assert cfg == PawnQueueConfig()
    assert cfg.s3 is None
    assert cfg.backend == "local"
    assert cfg.local == LocalConfig(path="./.pawnqueue", fsync=True)
    p = cfg.polling
    assert (p.interval_seconds, p.max_messages_per_poll, p.visibility_timeout_seconds) == (
        5.0,
        10,
        30.0,
    )
    assert (p.lease_refresh_interval_seconds, p.jitter_max_ms) == (10.0, 200)
    assert (p.max_delivery_count, p.claim_threads) == (5, 8)
    assert cfg.concurrency.strategy == "auto"
    assert cfg.concurrency.csprng_verify == CsprngVerifyConfig(
        jitter_min_ms=100, jitter_max_ms=400, verify_retries=2, verify_retry_delay_ms=150
    )
    assert cfg.registry.heartbeat_interval_seconds == 60.0
    assert cfg.publishing == PublishingConfig(max_payload_bytes=1048576, batch_threads=16)


def test_s3_defaults() -> None:
    s3 = load_config({"s3": {"bucket_name": "pawnqueue"}}, env={}).s3
    assert s3 is not None
    assert s3.endpoint_url is None
    assert s3.aws_access_key_id is None and s3.aws_secret_access_key is None
    assert s3.region_name == "us-east-1"
    assert s3.use_ssl is True and s3.create_bucket is False
    assert (s3.connect_timeout_seconds, s3.read_timeout_seconds) == (5.0, 30.0)
    assert s3.max_attempts == 5
    assert s3.max_pool_connections is None
    assert s3.addressing_style == "auto"


def test_default_env_is_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAWNQUEUE_POLLING_CLAIM_THREADS", "3")
    assert load_config().polling.claim_threads == 3


def test_config_objects_are_frozen() -> None:
    cfg = load_config(env={})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.polling.interval_seconds = 1.0  # type: ignore[misc]


def test_config_instance_returned_as_is() -> None:
    cfg = full_config()
    assert load_config(cfg, env={"PAWNQUEUE_POLLING_CLAIM_THREADS": "1"}) is cfg


def test_rejects_unsupported_source_type() -> None:
    with pytest.raises(TypeError, match="load_config"):
        load_config(42, env={})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- sources


def test_yaml_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
s3:
  endpoint_url: http://localhost:8333
  bucket_name: my-bucket
  aws_access_key_id: AK
  aws_secret_access_key: SK
  use_ssl: false
polling:
  interval_seconds: 1
  max_delivery_count: 3
concurrency:
  strategy: conditional_write
  csprng_verify:
    jitter_min_ms: 50
publishing:
  batch_threads: 4
""",
    )
    for source in (path, str(path)):
        cfg = load_config(source, env={})
        assert cfg.backend == "s3"
        assert cfg.s3 is not None
        assert cfg.s3.endpoint_url == "http://localhost:8333"
        assert cfg.s3.bucket_name == "my-bucket"
        assert cfg.s3.use_ssl is False
        assert cfg.polling.interval_seconds == 1.0
        assert isinstance(cfg.polling.interval_seconds, float)
        assert cfg.polling.max_delivery_count == 3
        assert cfg.polling.max_messages_per_poll == 10  # default kept
        assert cfg.concurrency.strategy == "conditional_write"
        assert cfg.concurrency.csprng_verify.jitter_min_ms == 50
        assert cfg.concurrency.csprng_verify.jitter_max_ms == 400
        assert cfg.publishing.batch_threads == 4


def test_empty_yaml_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "# nothing\n"), env={}) == PawnQueueConfig()


def test_yaml_empty_section_means_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "polling:\ns3:\n"), env={})
    assert cfg.polling == PollingConfig()
    assert cfg.s3 is None


def test_dict_source() -> None:
    cfg = load_config({"s3": S3_DICT, "local": {"path": Path("/tmp/pq")}}, env={})
    assert cfg.s3 is not None
    assert cfg.s3.bucket_name == "pawnqueue"
    assert cfg.s3.aws_access_key_id == ACCESS
    assert cfg.s3.aws_secret_access_key == SECRET
    assert cfg.local.path == "/tmp/pq"


def test_dict_may_hold_config_objects() -> None:
    cfg = load_config({"polling": PollingConfig(claim_threads=2)}, env={})
    assert cfg.polling.claim_threads == 2


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(path, env={})
    assert info.value.field == str(path)


def test_invalid_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "polling: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        load_config(path, env={})
    assert info.value.field == str(path)


def test_invalid_yaml_does_not_quote_secret_line(tmp_path: Path) -> None:
    path = write(tmp_path, f's3:\n  aws_secret_access_key: "{SECRET}\n  bucket_name: x\n')
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        load_config(path, env={})
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_yaml(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="mapping") as info:
        load_config(path, env={})
    assert info.value.field == str(path)


# --------------------------------------------------------------------------- precedence


def test_env_overrides_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "s3:\n  bucket_name: from-file\n  region_name: eu-west-1\n"
        "polling:\n  interval_seconds: 7\n",
    )
    env = {"PAWNQUEUE_S3_BUCKET_NAME": "from-env", "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "2.5"}
    cfg = load_config(path, env=env)
    assert cfg.s3 is not None
    assert cfg.s3.bucket_name == "from-env"
    assert cfg.s3.region_name == "eu-west-1"  # file value not overridden
    assert cfg.polling.interval_seconds == 2.5


def test_env_over_defaults() -> None:
    env = {
        "PAWNQUEUE_S3_BUCKET_NAME": "envbucket",
        "PAWNQUEUE_S3_ACCESS_KEY": ACCESS,
        "PAWNQUEUE_S3_SECRET_KEY": SECRET,
        "PAWNQUEUE_S3_CREATE_BUCKET": "yes",
        "PAWNQUEUE_LOCAL_PATH": "/data/pq",
        "PAWNQUEUE_POLLING_MAX_MESSAGES_PER_POLL": "7",
        "PAWNQUEUE_POLLING_MAX_DELIVERY_COUNT": "2",
        "PAWNQUEUE_CONCURRENCY_STRATEGY": "csprng_verify",
        "PAWNQUEUE_CSPRNG_JITTER_MAX_MS": "900",
        "PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL": "30",
        "PAWNQUEUE_PUBLISHING_MAX_PAYLOAD_BYTES": "2048",
    }
    cfg = load_config(env=env)
    assert cfg.backend == "s3"
    assert cfg.s3 is not None
    assert (cfg.s3.bucket_name, cfg.s3.create_bucket) == ("envbucket", True)
    assert cfg.s3.aws_access_key_id == ACCESS
    assert cfg.s3.aws_secret_access_key == SECRET
    assert cfg.local.path == "/data/pq"
    assert cfg.polling.max_messages_per_poll == 7
    assert cfg.polling.max_delivery_count == 2
    assert cfg.concurrency.strategy == "csprng_verify"
    assert cfg.concurrency.csprng_verify.jitter_max_ms == 900
    assert cfg.registry.heartbeat_interval_seconds == 30.0
    assert isinstance(cfg.registry.heartbeat_interval_seconds, float)
    assert cfg.publishing.max_payload_bytes == 2048


def test_empty_env_value_counts_as_unset() -> None:
    cfg = load_config(env={"PAWNQUEUE_S3_ENDPOINT_URL": "", "PAWNQUEUE_POLLING_JITTER_MAX_MS": ""})
    assert cfg == PawnQueueConfig()


def test_explicit_dict_beats_env() -> None:
    env = {
        "PAWNQUEUE_S3_BUCKET_NAME": "from-env",
        "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "9",
        "PAWNQUEUE_CSPRNG_JITTER_MIN_MS": "1",
    }
    cfg = load_config(
        {
            "s3": {"bucket_name": "explicit"},
            "polling": {"interval_seconds": 3},
            "concurrency": {"csprng_verify": {"jitter_min_ms": 200}},
        },
        env=env,
    )
    assert cfg.s3 is not None
    assert cfg.s3.bucket_name == "explicit"
    assert cfg.polling.interval_seconds == 3.0
    assert cfg.concurrency.csprng_verify.jitter_min_ms == 200


def test_env_fills_what_dict_lacks() -> None:
    env = {
        "PAWNQUEUE_S3_REGION": "ap-south-1",
        "PAWNQUEUE_POLLING_CLAIM_THREADS": "12",
        "PAWNQUEUE_CSPRNG_VERIFY_RETRIES": "6",
    }
    cfg = load_config({"s3": {"bucket_name": "explicit"}, "polling": {}}, env=env)
    assert cfg.s3 is not None
    assert cfg.s3.region_name == "ap-south-1"
    assert cfg.polling.claim_threads == 12
    assert cfg.concurrency.csprng_verify.verify_retries == 6


def test_env_can_add_s3_section_to_dict() -> None:
    cfg = load_config(
        {"polling": {"claim_threads": 2}}, env={"PAWNQUEUE_S3_BUCKET_NAME": "envbucket"}
    )
    assert cfg.backend == "s3"
    assert cfg.s3 is not None and cfg.s3.bucket_name == "envbucket"


def test_explicit_s3_none_beats_env() -> None:
    cfg = load_config({"s3": None}, env={"PAWNQUEUE_S3_BUCKET_NAME": "envbucket"})
    assert cfg.s3 is None
    assert cfg.backend == "local"


def test_dict_is_not_mutated() -> None:
    source: dict[str, Any] = {
        "s3": {"bucket_name": "explicit"},
        "polling": {"interval_seconds": 3},
        "concurrency": {"csprng_verify": {"jitter_min_ms": 10}},
    }
    nested_s3 = source["s3"]
    nested_csprng = source["concurrency"]["csprng_verify"]
    before = copy.deepcopy(source)
    env = {
        "PAWNQUEUE_S3_REGION": "eu-west-1",
        "PAWNQUEUE_POLLING_CLAIM_THREADS": "2",
        "PAWNQUEUE_CSPRNG_JITTER_MAX_MS": "20",
        "PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL": "5",
    }
    cfg = load_config(source, env=env)
    assert cfg.s3 is not None and cfg.s3.region_name == "eu-west-1"  # env was applied...
    assert source == before  # ...but not into the caller's dict
    assert source["s3"] is nested_s3 and nested_s3 == {"bucket_name": "explicit"}
    assert nested_csprng == {"jitter_min_ms": 10}
    assert "registry" not in source
