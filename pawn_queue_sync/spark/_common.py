"""What the Spark side shares: connection settings that travel to executors without
ever being shown, one started queue per process, and the conversions between message
documents, Spark rows and JSON.

Nothing here holds a client across a process boundary: executors receive a plain
configuration (:class:`Settings`) and build their own :class:`~pawn_queue_sync.PawnQueue`
once per process (keyed by ``os.getpid()``), reused by later tasks when Spark reuses
its Python workers (``spark.python.worker.reuse``, the default).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from .. import layout
from ..config import PawnQueueConfig, load_config, redact_endpoint
from ..encoding import canonical_json
from ..errors import ConfigError
from ..queue.core import PawnQueue

log = logging.getLogger(__name__)

ConfigSource = PawnQueueConfig | Mapping[str, Any] | str | os.PathLike[str] | None

#: Namespace of message ids derived from a column value (``uuid5(NS, "topic:value")``).
ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pypi.org/project/pawn-queue-sync/spark")

#: Data source options that are connection settings: option -> dotted config path.
#: The credential options are named so that Spark's default ``spark.redaction.regex``
#: (``secret|password|token|access[.]?key``) hides their values in plans: never
#: ``aws_access_key_id`` (not redacted).
CONNECTION_OPTIONS: Mapping[str, str] = {
    "endpointUrl": "s3.endpoint_url",
    "bucketName": "s3.bucket_name",
    "regionName": "s3.region_name",
    "accessKey": "s3.aws_access_key_id",
    "secretKey": "s3.aws_secret_access_key",
    "useSsl": "s3.use_ssl",
    "addressingStyle": "s3.addressing_style",
    "fastPath": "s3.fast_path",
    "localPath": "local.path",
}
_BOOL_OPTIONS = frozenset({"s3.use_ssl", "s3.fast_path"})
#: Option naming a YAML configuration file (read on the driver, where plans are made).
CONFIG_PATH_OPTION = "configPath"
#: Option names that would show a credential in plans: refused with a pointer.
UNREDACTED_OPTIONS = {"aws_access_key_id": "accessKey", "aws_secret_access_key": "secretKey",
               "access_key": "accessKey", "secret_key": "secretKey"}


def spark_options(config: ConfigSource) -> dict[str, str]:
    """Data source options for the connection settings of ``config`` (s3 only).

    Other settings (polling, publishing) are not options: use ``configPath`` for them.
    """
    cfg = load_config(config)
    if cfg.s3 is None:
        return {"localPath": cfg.local.path}
    s3 = cfg.s3
    out = {"bucketName": s3.bucket_name, "regionName": s3.region_name,
           "useSsl": str(s3.use_ssl).lower(), "addressingStyle": s3.addressing_style,
           "fastPath": str(s3.fast_path).lower()}
    if s3.endpoint_url:
        out["endpointUrl"] = s3.endpoint_url
    if s3.aws_access_key_id and s3.aws_secret_access_key:
        out["accessKey"] = s3.aws_access_key_id
        out["secretKey"] = s3.aws_secret_access_key
    return out


# Schemas (DDL) of the rows the data source and consume_to_dataframe produce.
MESSAGE_COLUMNS = (
    "id STRING, topic STRING, producer_id STRING, created_at TIMESTAMP, payload STRING"
)
SNAPSHOT_SCHEMA = f"{MESSAGE_COLUMNS}, key STRING, attempts INT, last_error STRING"
DEAD_LETTER_SCHEMA = (
    f"{MESSAGE_COLUMNS}, key STRING, reason STRING, dead_lettered_at TIMESTAMP, "
    "delivery_count INT, consumer_id STRING, original_key STRING"
)


class Settings:
    """A resolved configuration to hand to executors: plain data, picklable, and
    never shown: ``repr`` names the backend, bucket and endpoint only."""

    __slots__ = ("_data", "_fingerprint")

    def __init__(self, config: ConfigSource) -> None:
        cfg = load_config(config)
        self._data: dict[str, Any] = cfg.to_dict()
        self._fingerprint = hashlib.sha256(canonical_json(self._data)).hexdigest()

    @property
    def fingerprint(self) -> str:
        """A digest of every setting: equal settings share one queue per process."""
        return self._fingerprint

    def config(self) -> PawnQueueConfig:
        return load_config(self._data)

    def describe(self) -> str:
        s3 = self._data.get("s3")
        if s3:
            where = redact_endpoint(s3.get("endpoint_url") or "AWS")
            return f"s3 bucket {s3['bucket_name']!r} at {where}"
        return f"local store at {self._data['local']['path']!r}"

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"

    def __getstate__(self) -> tuple[dict[str, Any], str]:
        return self._data, self._fingerprint

    def __setstate__(self, state: tuple[dict[str, Any], str]) -> None:
        self._data, self._fingerprint = state

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Settings:
        """Settings from data source options (case-insensitive): ``configPath`` (a
        YAML file), then the connection options on top (see
        :data:`CONNECTION_OPTIONS`), then the ``PAWNQUEUE_*`` environment for whatever
        is still unset."""
        opts = {k.lower(): v for k, v in options.items()}
        for bad, good in UNREDACTED_OPTIONS.items():
            if bad in opts:
                raise ConfigError(
                    bad, f"use the option {good!r} instead: Spark shows {bad!r} in plans"
                )
        path = opts.get(CONFIG_PATH_OPTION.lower())
        base: dict[str, Any] = load_config(path).to_dict() if path else {}
        given = {
            dotted: opts[name.lower()]
            for name, dotted in CONNECTION_OPTIONS.items()
            if name.lower() in opts
        }
        if not given:
            return cls(base or None)
        if any(p.startswith("s3.") for p in given) and base.get("s3") is None:
            base["s3"] = {}
        for dotted, raw in given.items():
            section, leaf = dotted.split(".")
            value: Any = raw
            if dotted in _BOOL_OPTIONS:
                word = str(raw).strip().lower()
                if word not in ("true", "false"):
                    raise ConfigError(dotted, "option must be 'true' or 'false'")
                value = word == "true"
            base.setdefault(section, {})[leaf] = value
        return cls(base)


# -- one started queue per process ---------------------------------------------------------

_queues: dict[tuple[int, str], PawnQueue] = {}
_queues_lock = threading.Lock()


def queue_for(settings: Settings) -> PawnQueue:
    """The started queue of this process for ``settings`` (built on first use).

    Kept for the life of the process so a reused Python worker pays the client build
    and capability probe once; its thread pools are idle between tasks, so nothing is
    lost when a non-reused worker exits.
    """
    key = (os.getpid(), settings.fingerprint)
    with _queues_lock:
        pq = _queues.get(key)
        if pq is None:
            for stale in [k for k in _queues if k[0] != key[0]]:
                del _queues[stale]  # inherited across a fork: never used here
            pq = PawnQueue(settings.config()).setup()
            _queues[key] = pq
        return pq


_settings_cache: dict[str, Settings] = {}


def executor_queue(config: ConfigSource | Settings) -> PawnQueue:
    """The started queue of this process for ``config``, for use inside Spark tasks
    (handlers, ``mapPartitions``): built once per process, shared, never to be closed
    by the caller. Pass the same plain configuration you gave the driver-side call."""
    if isinstance(config, Settings):
        return queue_for(config)
    if isinstance(config, Mapping):  # cache by content: handlers call this per message
        try:
            digest = hashlib.sha256(canonical_json(dict(config))).hexdigest()
        except (TypeError, ValueError):  # not plain JSON data: no caching
            return queue_for(Settings(config))
        settings = _settings_cache.get(digest)
        if settings is None:
            settings = _settings_cache[digest] = Settings(config)
        return queue_for(settings)
    return queue_for(Settings(config))


# -- conversions ---------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """A Spark value as JSON data: Rows and maps become objects, timestamps ISO 8601
    strings in UTC, dates ISO strings, decimals strings (exact), bytes base64."""
    from pyspark.sql import Row

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Row):
        return {k: to_jsonable(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, _dt.datetime):
        return as_utc(value).isoformat()  # type: ignore[union-attr]
    if isinstance(value, (_dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot convert {type(value).__name__} to JSON")


def message_id_for(topic: str, value: Any) -> str:
    """A deterministic message id from a column value: the value itself when it is a
    UUID, else ``uuid5`` of ``"topic:value"``."""
    if value is None:
        raise ValueError("the id column is null")
    text = str(value)
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return str(uuid.uuid5(ID_NAMESPACE, f"{topic}:{text}"))


def as_utc(value: Any) -> _dt.datetime | None:
    """A timestamp column value (or ISO text) as an aware UTC datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        value = _dt.datetime.fromisoformat(value)
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = _dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, _dt.datetime):
        raise TypeError(f"not a timestamp: {type(value).__name__}")
    if value.tzinfo is None:
        value = value.astimezone()  # Spark hands naive local times to Python
    return value.astimezone(_dt.timezone.utc)


def parse_time(text: Any) -> _dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=_dt.timezone.utc)


def payload_text(payload: Any) -> str:
    """A payload as compact JSON text (the ``payload`` column)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def decode_doc(raw: bytes) -> dict[str, Any] | None:
    """A message document, or None if the body is not a JSON object."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def snapshot_row(topic: str, key: str, doc: dict[str, Any] | None) -> tuple[Any, ...]:
    """A row of :data:`SNAPSHOT_SCHEMA` (a malformed body gives a row of its key only)."""
    if doc is None:
        mid = layout.parse_message_key(topic, key)
        return (mid, topic, None, None, None, key, None, "malformed message body")
    attempts = doc.get("attempts")
    return (
        str(doc.get("id")),
        topic,
        doc.get("producer_id"),
        parse_time(doc.get("created_at")),
        payload_text(doc.get("payload")),
        key,
        attempts if isinstance(attempts, int) else 0,
        doc.get("last_error"),
    )


def dead_letter_row(topic: str, key: str, doc: dict[str, Any] | None) -> tuple[Any, ...]:
    """A row of :data:`DEAD_LETTER_SCHEMA`."""
    if doc is None:
        return (None, topic, None, None, None, key, "malformed dead-letter body",
                None, None, None, None)
    dl = doc.get("dead_letter") if isinstance(doc.get("dead_letter"), dict) else {}
    count = dl.get("delivery_count")
    return (
        None if doc.get("id") is None else str(doc.get("id")),
        topic,
        doc.get("producer_id"),
        parse_time(doc.get("created_at")),
        payload_text(doc.get("payload")),
        key,
        dl.get("reason"),
        parse_time(dl.get("at")),
        count if isinstance(count, int) else None,
        dl.get("consumer_id"),
        dl.get("original_key"),
    )


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` in ``parts`` contiguous chunks of near-equal size (no empty chunk)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out: list[list[Any]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [c for c in out if c]


def share(total: int | None, parts: int, index: int) -> int | None:
    """Task ``index``'s share of ``total`` split over ``parts`` tasks (None: no limit)."""
    if total is None:
        return None
    base, extra = divmod(total, parts)
    return base + (1 if index < extra else 0)
