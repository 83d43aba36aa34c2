"""Tests for pawn_queue_sync.config: the builder (its setters made from the schema), the
schema's units, and the table of environment variables."""

from __future__ import annotations

import inspect
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
from tests.config_cases import ACCESS, SECRET, clean_environ


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environ(monkeypatch)


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
    "polling.max_segments_held": 10,
    "concurrency.strategy": "csprng_verify",
    "concurrency.csprng_verify.jitter_min_ms": 11,
    "concurrency.csprng_verify.jitter_max_ms": 12,
    "concurrency.csprng_verify.verify_retries": 13,
    "concurrency.csprng_verify.verify_retry_delay_ms": 14,
    "concurrency.csprng_verify.consistent_list": False,
    "registry.heartbeat_interval_seconds": 15.0,
    "publishing.max_payload_bytes": 16,
    "publishing.batch_threads": 17,
    "publishing.max_segment_messages": 18,
    "publishing.max_segment_bytes": 2_000_000,
    "publishing.linger_ms": 19,
    "publishing.max_delay_seconds": 3600.0,
    "publishing.dedup_window_seconds": 20.0,
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
    # packed topics' group-commit window: milliseconds, like the other short waits
    "publishing.linger_ms",
}


def test_every_duration_names_its_unit() -> None:
    """Durations are ``*_seconds`` (floats), but for pawn-queue's four ``*_ms`` ints and
    ``publishing.linger_ms``."""
    words = ("interval", "timeout", "delay", "jitter", "wait", "sleep", "ttl", "period",
             "duration", "grace", "backoff", "seconds", "_ms")
    settings = _settings()
    durations = {p for p in settings if any(w in p.rsplit(".", 1)[1] for w in words)}
    assert {p for p in durations if not p.endswith("_seconds")} == PAWN_QUEUE_MS_SETTINGS
    floats = {p for p, f in settings.items() if f.metadata.get("kind") == "float"}
    assert floats == {p for p in durations if p.endswith("_seconds")}


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
    "polling.max_segments_held": "PAWNQUEUE_POLLING_MAX_SEGMENTS_HELD",
    "publishing.max_payload_bytes": "PAWNQUEUE_PUBLISHING_MAX_PAYLOAD_BYTES",
    "publishing.batch_threads": "PAWNQUEUE_PUBLISHING_BATCH_THREADS",
    "publishing.max_segment_messages": "PAWNQUEUE_PUBLISHING_MAX_SEGMENT_MESSAGES",
    "publishing.max_segment_bytes": "PAWNQUEUE_PUBLISHING_MAX_SEGMENT_BYTES",
    "publishing.linger_ms": "PAWNQUEUE_PUBLISHING_LINGER_MS",
    "publishing.max_delay_seconds": "PAWNQUEUE_PUBLISHING_MAX_DELAY_SECONDS",
    "publishing.dedup_window_seconds": "PAWNQUEUE_PUBLISHING_DEDUP_WINDOW_SECONDS",
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
        "publishing.max_segment_bytes": ("2000000", 2000000),
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
