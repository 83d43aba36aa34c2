"""Conversions between message documents, Spark rows and JSON: the schemas of the rows
the Spark side produces, rows of message documents, JSON data of Spark values, and
message ids derived from a column value."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import uuid
from collections.abc import Mapping
from typing import Any

from .. import layout

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "ID_NAMESPACE",
    "MESSAGE_COLUMNS",
    "SNAPSHOT_SCHEMA",
    "as_utc",
    "dead_letter_row",
    "decode_doc",
    "message_id_for",
    "parse_time",
    "payload_text",
    "snapshot_row",
    "to_jsonable",
]

#: Namespace of message ids derived from a column value (``uuid5(NS, "topic:value")``).
ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pypi.org/project/pawn-queue-sync/spark")

# Schemas (DDL) of the rows the data source and consume_to_dataframe produce.
MESSAGE_COLUMNS = (
    "id STRING, topic STRING, producer_id STRING, created_at TIMESTAMP, payload STRING"
)
SNAPSHOT_SCHEMA = f"{MESSAGE_COLUMNS}, key STRING, attempts INT, last_error STRING"
DEAD_LETTER_SCHEMA = (
    f"{MESSAGE_COLUMNS}, key STRING, reason STRING, dead_lettered_at TIMESTAMP, "
    "delivery_count INT, consumer_id STRING, original_key STRING"
)


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
