"""Tests for pawn_queue_sync.config: loading, precedence, validation, secrecy."""

from __future__ import annotations

import copy
import inspect
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import attrs
import pytest

from pawn_queue_sync.config import (
    ENV_VARS,
    SECRET_FIELDS,
    ConcurrencyConfig,
    CsprngVerifyConfig,
    LocalConfig,
    PawnQueueBuilder,
    PawnQueueConfig,
    PollingConfig,
    PublishingConfig,
    RegistryConfig,
    S3Config,
    dump_env_docs,
    load_config,
)
from pawn_queue_sync.errors import ConfigError

ACCESS = "AKIA-ACCESS-ID-4711"
SECRET = "s3cr3t-VALUE-do-not-leak-0815"

S3_DICT: dict[str, Any] = {
    "endpoint_url": "http://localhost:9000",
    "bucket_name": "pawnqueue",
    "aws_access_key_id": ACCESS,
    "aws_secret_access_key": SECRET,
}


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see PAWNQUEUE_* variables of the machine running them."""
    for name in ENV_VARS.values():
        monkeypatch.delenv(name, raising=False)


def write(tmp_path: Path, text: str, name: str = "pawnqueue.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def full_config() -> PawnQueueConfig:
    """A config with every section set to non-default values."""
    return load_config(
        {
            "s3": {
                **S3_DICT,
                "region_name": "eu-central-1",
                "use_ssl": False,
                "create_bucket": True,
                "connect_timeout_seconds": 2.5,
                "read_timeout_seconds": 45,
                "max_attempts": 3,
                "max_pool_connections": 64,
                "addressing_style": "path",
            },
            "local": {"path": "/var/lib/pq", "fsync": False},
            "polling": {
                "interval_seconds": 0.5,
                "max_messages_per_poll": 25,
                "visibility_timeout_seconds": 20,
                "lease_refresh_interval_seconds": 5,
                "jitter_max_ms": 0,
                "max_delivery_count": 9,
                "claim_threads": 4,
            },
            "concurrency": {
                "strategy": "csprng_verify",
                "csprng_verify": {
                    "jitter_min_ms": 10,
                    "jitter_max_ms": 20,
                    "verify_retries": 1,
                    "verify_retry_delay_ms": 5,
                },
            },
            "registry": {"heartbeat_interval_seconds": 15},
            "publishing": {"max_payload_bytes": 4096, "batch_threads": 2},
        },
        env={},
    )


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


# --------------------------------------------------------------------------- builder


def test_builder_values() -> None:
    cfg = (
        PawnQueueBuilder()
        .s3(
            endpoint_url="http://localhost:9000",
            bucket_name="pawnqueue",
            access_key=ACCESS,
            secret_key=SECRET,
            region_name="eu-central-1",
            use_ssl=False,
            create_bucket=True,
        )
        .local(path=Path("/tmp/x"))
        .polling(
            interval_seconds=2,
            max_messages_per_poll=3,
            visibility_timeout_seconds=40,
            lease_refresh_interval_seconds=4,
            jitter_max_ms=5,
            max_delivery_count=6,
            claim_threads=7,
        )
        .concurrency(
            strategy="conditional_write",
            jitter_min_ms=8,
            jitter_max_ms=9,
            verify_retries=10,
            verify_retry_delay_ms=11,
        )
        .registry(heartbeat_interval_seconds=12)
        .publishing(max_payload_bytes=13, batch_threads=14)
        .build_config()
    )
    assert cfg.s3 == S3Config(
        endpoint_url="http://localhost:9000",
        bucket_name="pawnqueue",
        aws_access_key_id=ACCESS,
        aws_secret_access_key=SECRET,
        region_name="eu-central-1",
        use_ssl=False,
        create_bucket=True,
    )
    assert cfg.local.path == "/tmp/x"
    assert cfg.polling == PollingConfig(
        interval_seconds=2.0,
        max_messages_per_poll=3,
        visibility_timeout_seconds=40.0,
        lease_refresh_interval_seconds=4.0,
        jitter_max_ms=5,
        max_delivery_count=6,
        claim_threads=7,
    )
    assert cfg.concurrency == ConcurrencyConfig(
        strategy="conditional_write",
        csprng_verify=CsprngVerifyConfig(
            jitter_min_ms=8, jitter_max_ms=9, verify_retries=10, verify_retry_delay_ms=11
        ),
    )
    assert cfg.registry == RegistryConfig(heartbeat_interval_seconds=12.0)
    assert cfg.publishing == PublishingConfig(max_payload_bytes=13, batch_threads=14)


def test_builder_beats_env() -> None:
    env = {"PAWNQUEUE_S3_BUCKET_NAME": "from-env", "PAWNQUEUE_POLLING_CLAIM_THREADS": "99"}
    for builder in (
        PawnQueueBuilder().from_env(env).s3(bucket_name="built").polling(claim_threads=2),
        PawnQueueBuilder().s3(bucket_name="built").polling(claim_threads=2).from_env(env),
    ):
        cfg = builder.build_config()
        assert cfg.s3 is not None and cfg.s3.bucket_name == "built"
        assert cfg.polling.claim_threads == 2


def test_builder_from_env_fills_gaps() -> None:
    env = {
        "PAWNQUEUE_S3_ACCESS_KEY": ACCESS,
        "PAWNQUEUE_S3_SECRET_KEY": SECRET,
        "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": "60",
        "PAWNQUEUE_PUBLISHING_BATCH_THREADS": "3",
    }
    cfg = PawnQueueBuilder().s3(bucket_name="built").from_env(env).build_config()
    assert cfg.s3 is not None
    assert cfg.s3.aws_access_key_id == ACCESS
    assert cfg.s3.aws_secret_access_key == SECRET
    assert cfg.polling.visibility_timeout_seconds == 60.0
    assert cfg.publishing.batch_threads == 3


def test_builder_from_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL", "7")
    assert PawnQueueBuilder().from_env().build_config().registry.heartbeat_interval_seconds == 7


def test_builder_without_from_env_ignores_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAWNQUEUE_S3_BUCKET_NAME", "from-env")
    monkeypatch.setenv("PAWNQUEUE_POLLING_CLAIM_THREADS", "3")
    cfg = PawnQueueBuilder().build_config()
    assert cfg == PawnQueueConfig()


def test_builder_without_s3_uses_local_store() -> None:
    cfg = PawnQueueBuilder().local(path="/tmp/q").build_config()
    assert cfg.backend == "local"
    assert cfg.local.path == "/tmp/q"


def test_builder_s3_without_bucket() -> None:
    with pytest.raises(ConfigError, match=r"^s3\.bucket_name: required"):
        PawnQueueBuilder().s3(endpoint_url="http://localhost:9000").build_config()


def test_builder_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^polling\.claim_threads: .*builder") as info:
        PawnQueueBuilder().polling(claim_threads=0).build_config()
    assert info.value.field == "polling.claim_threads"


def test_builder_build_returns_pawn_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakePawnQueue:
        def __init__(self, config: PawnQueueConfig) -> None:
            self.config = config

    fake = types.ModuleType("pawn_queue_sync.queue.core")
    fake.PawnQueue = FakePawnQueue  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pawn_queue_sync.queue.core", fake)
    queue = PawnQueueBuilder().polling(claim_threads=3).build()
    assert isinstance(queue, FakePawnQueue)
    assert queue.config.polling.claim_threads == 3
    assert queue.config.backend == "local"


def _settings(cls: type = PawnQueueConfig, prefix: str = "") -> dict[str, Any]:
    """Every setting of the schema, walked here from the attrs classes: dotted path ->
    its attrs field."""
    out: dict[str, Any] = {}
    for field in attrs.fields(cls):
        section = field.type if attrs.has(field.type) else field.metadata.get("section")
        if section is not None:
            out.update(_settings(section, f"{prefix}{field.name}."))
        else:
            out[prefix + field.name] = field
    return out


#: A valid value other than its default for every setting, so a setting the builder
#: does not reach shows as its default. A new setting fails the test until it is here.
NON_DEFAULTS: dict[str, Any] = {
    "s3.endpoint_url": "http://h:1",
    "s3.bucket_name": "bkt",
    "s3.aws_access_key_id": ACCESS,
    "s3.aws_secret_access_key": SECRET,
    "s3.region_name": "r-1",
    "s3.use_ssl": False,
    "s3.create_bucket": True,
    "s3.connect_timeout_seconds": 6.0,
    "s3.read_timeout_seconds": 31.0,
    "s3.max_attempts": 2,
    "s3.max_pool_connections": 3,
    "s3.addressing_style": "path",
    "s3.fast_path": False,
    "local.path": "/tmp/non-default",
    "local.fsync": False,
    "polling.interval_seconds": 1.5,
    "polling.max_messages_per_poll": 4,
    "polling.visibility_timeout_seconds": 41.0,
    "polling.lease_refresh_interval_seconds": 9.0,
    "polling.jitter_max_ms": 7,
    "polling.max_delivery_count": 8,
    "polling.claim_threads": 9,
    "concurrency.strategy": "csprng_verify",
    "concurrency.csprng_verify.jitter_min_ms": 11,
    "concurrency.csprng_verify.jitter_max_ms": 12,
    "concurrency.csprng_verify.verify_retries": 13,
    "concurrency.csprng_verify.verify_retry_delay_ms": 14,
    "concurrency.csprng_verify.consistent_list": False,
    "registry.heartbeat_interval_seconds": 15.0,
    "publishing.max_payload_bytes": 16,
    "publishing.batch_threads": 17,
}
#: pawn-queue's builder spells two settings otherwise: ``s3(access_key=, secret_key=)``.
BUILDER_NAMES = {"s3.aws_access_key_id": "access_key", "s3.aws_secret_access_key": "secret_key"}


def test_builder_sets_every_setting_of_the_schema() -> None:
    """The builder's setters come from the schema: each setting, sub-sections' included,
    is a keyword of its top-level section's method (by its name, or pawn-queue's)."""
    settings = _settings()
    assert set(NON_DEFAULTS) == set(settings), "give every setting a value in NON_DEFAULTS"
    keywords: dict[str, dict[str, Any]] = {}
    for path, value in NON_DEFAULTS.items():
        assert value != settings[path].default, path
        name = BUILDER_NAMES.get(path, path.rsplit(".", 1)[1])
        keywords.setdefault(path.split(".", 1)[0], {})[name] = value
    assert set(keywords) == {f.name for f in attrs.fields(PawnQueueConfig)}
    builder = PawnQueueBuilder()
    for section, values in keywords.items():
        method = getattr(builder, section)
        assert list(inspect.signature(method).parameters) == list(values), section
        assert method(**values) is builder
    built = builder.build_config()
    got = {}
    for path in NON_DEFAULTS:
        node: Any = built
        for part in path.split("."):
            node = getattr(node, part)
        got[path] = node
    assert got == NON_DEFAULTS


def test_builder_rejects_a_keyword_of_another_section() -> None:
    with pytest.raises(TypeError, match=r"polling\(\) got an unexpected keyword .*'strategy'"):
        PawnQueueBuilder().polling(strategy="auto")
    with pytest.raises(TypeError):
        PawnQueueBuilder().polling(2)  # type: ignore[misc]  # keywords only, as before


#: pawn-queue 0.1.3's durations in milliseconds: its YAML keys and variables, kept.
PAWN_QUEUE_MS_SETTINGS = {
    "polling.jitter_max_ms",
    "concurrency.csprng_verify.jitter_min_ms",
    "concurrency.csprng_verify.jitter_max_ms",
    "concurrency.csprng_verify.verify_retry_delay_ms",
}


def test_every_duration_names_its_unit() -> None:
    """Durations are ``*_seconds`` (floats), but for pawn-queue's four ``*_ms`` ints."""
    words = ("interval", "timeout", "delay", "jitter", "wait", "sleep", "ttl", "period",
             "duration", "grace", "backoff", "seconds", "_ms")
    settings = _settings()
    durations = {p for p in settings if any(w in p.rsplit(".", 1)[1] for w in words)}
    assert {p for p in durations if not p.endswith("_seconds")} == PAWN_QUEUE_MS_SETTINGS
    floats = {p for p, f in settings.items() if f.metadata.get("kind") == "float"}
    assert floats == {p for p in durations if p.endswith("_seconds")}


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
    ],
)
def test_bad_values(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data, env={})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


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


# --------------------------------------------------------------------------- env table


PAWN_QUEUE_ENV_NAMES = {
    "s3.endpoint_url": "PAWNQUEUE_S3_ENDPOINT_URL",
    "s3.bucket_name": "PAWNQUEUE_S3_BUCKET_NAME",
    "s3.aws_access_key_id": "PAWNQUEUE_S3_ACCESS_KEY",
    "s3.aws_secret_access_key": "PAWNQUEUE_S3_SECRET_KEY",
    "s3.region_name": "PAWNQUEUE_S3_REGION",
    "s3.use_ssl": "PAWNQUEUE_S3_USE_SSL",
    "polling.interval_seconds": "PAWNQUEUE_POLLING_INTERVAL_SECONDS",
    "polling.max_messages_per_poll": "PAWNQUEUE_POLLING_MAX_MESSAGES_PER_POLL",
    "polling.visibility_timeout_seconds": "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT",
    "polling.lease_refresh_interval_seconds": "PAWNQUEUE_POLLING_LEASE_REFRESH_INTERVAL",
    "polling.jitter_max_ms": "PAWNQUEUE_POLLING_JITTER_MAX_MS",
    "concurrency.strategy": "PAWNQUEUE_CONCURRENCY_STRATEGY",
    "concurrency.csprng_verify.jitter_min_ms": "PAWNQUEUE_CSPRNG_JITTER_MIN_MS",
    "concurrency.csprng_verify.jitter_max_ms": "PAWNQUEUE_CSPRNG_JITTER_MAX_MS",
    "concurrency.csprng_verify.verify_retries": "PAWNQUEUE_CSPRNG_VERIFY_RETRIES",
    "concurrency.csprng_verify.verify_retry_delay_ms": "PAWNQUEUE_CSPRNG_RETRY_DELAY_MS",
    "registry.heartbeat_interval_seconds": "PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL",
}
OUR_ENV_NAMES = {
    "local.path": "PAWNQUEUE_LOCAL_PATH",
    "s3.create_bucket": "PAWNQUEUE_S3_CREATE_BUCKET",
    "s3.fast_path": "PAWNQUEUE_S3_FAST_PATH",
    "concurrency.csprng_verify.consistent_list": "PAWNQUEUE_CSPRNG_CONSISTENT_LIST",
    "polling.max_delivery_count": "PAWNQUEUE_POLLING_MAX_DELIVERY_COUNT",
    "polling.claim_threads": "PAWNQUEUE_POLLING_CLAIM_THREADS",
    "publishing.max_payload_bytes": "PAWNQUEUE_PUBLISHING_MAX_PAYLOAD_BYTES",
    "publishing.batch_threads": "PAWNQUEUE_PUBLISHING_BATCH_THREADS",
}


def test_env_var_names_match_pawn_queue() -> None:
    assert dict(ENV_VARS) == {**PAWN_QUEUE_ENV_NAMES, **OUR_ENV_NAMES}


@pytest.mark.parametrize(("path", "name"), sorted(ENV_VARS.items()))
def test_every_env_var_is_loaded(path: str, name: str) -> None:
    """Each variable reaches the field its table entry names."""
    samples = {
        "s3.endpoint_url": ("http://h:1", "http://h:1"),
        "s3.bucket_name": ("bkt", "bkt"),
        "s3.region_name": ("r-1", "r-1"),
        "s3.use_ssl": ("no", False),
        "s3.create_bucket": ("yes", True),
        "s3.fast_path": ("false", False),
        "concurrency.csprng_verify.consistent_list": ("no", False),
        "local.path": ("/p", "/p"),
        "concurrency.strategy": ("conditional_write", "conditional_write"),
        "polling.interval_seconds": ("1.5", 1.5),
        "polling.visibility_timeout_seconds": ("99", 99.0),
        "polling.lease_refresh_interval_seconds": ("3", 3.0),
        "registry.heartbeat_interval_seconds": ("8", 8.0),
        "concurrency.csprng_verify.jitter_max_ms": ("777", 777),
    }
    raw, expected = samples.get(path, ("3", 3))
    env = {name: raw}
    if path.startswith("s3.") and path != "s3.bucket_name":
        env["PAWNQUEUE_S3_BUCKET_NAME"] = "bkt"
    if path in SECRET_FIELDS:
        env = {
            "PAWNQUEUE_S3_BUCKET_NAME": "bkt",
            "PAWNQUEUE_S3_ACCESS_KEY": "a",
            "PAWNQUEUE_S3_SECRET_KEY": "s",
            name: "value-x",
        }
        expected = "value-x"
    cfg = load_config(env=env)
    node: Any = cfg
    for part in path.split("."):
        node = getattr(node, part)
    assert node == expected


def test_dump_env_docs() -> None:
    doc = dump_env_docs()
    lines = doc.splitlines()
    assert lines[0].startswith("| Variable |")
    for path, name in ENV_VARS.items():
        row = next(line for line in lines if f"`{name}`" in line)
        assert f"`{path}`" in row
    assert "| `PAWNQUEUE_POLLING_INTERVAL_SECONDS` | `polling.interval_seconds` | `5.0` |" in doc
    assert "| `PAWNQUEUE_S3_USE_SSL` | `s3.use_ssl` | `true` |" in doc
    assert "| `PAWNQUEUE_PUBLISHING_BATCH_THREADS` | `publishing.batch_threads` | `16` |" in doc


def test_pawnqueue_takes_what_from_config_takes(tmp_path: Path) -> None:
    """``PawnQueue(dict)`` and ``PawnQueue(path)`` once failed with AttributeError on the
    first use (docs/runtime.md's drain example); anything else is a ConfigError."""
    from pawn_queue_sync import PawnQueue
    from pawn_queue_sync.errors import ConfigError as _ConfigError

    store_dir = tmp_path / "store"
    as_dict = {"local": {"path": str(store_dir)}}
    path = tmp_path / "c.yaml"
    path.write_text(f"local:\n  path: {store_dir}\n")
    for source in (as_dict, path, str(path)):
        with PawnQueue(source) as pq:
            assert pq.create_topic("orders") in (True, False)
            assert pq.config.local.path == str(store_dir)
    with pytest.raises(_ConfigError, match="a YAML path, a dict or a PawnQueueConfig"):
        PawnQueue(42)  # type: ignore[arg-type]
