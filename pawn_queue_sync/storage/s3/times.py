"""S3's timestamps as aware UTC datetimes: ISO 8601 in XML bodies, RFC 1123 in
headers; the server's clock only, never the local one standing in for it."""

from __future__ import annotations

from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from ...errors import StorageError

__all__ = ["http_date", "listed_time", "parse_timestamp", "utc"]


def _strict_timestamp(value: str) -> datetime:
    """ISO 8601 or RFC 1123; botocore's own parser (dateutil) for anything else.
    Raises ValueError (or TypeError) when unreadable."""
    try:
        if value[:4].isdigit():
            return datetime.fromisoformat(value).astimezone(timezone.utc)
        return parsedate_to_datetime(value).astimezone(timezone.utc)
    except (TypeError, ValueError, IndexError):
        from botocore.utils import parse_timestamp as botocore_parse

        return botocore_parse(value)  # type: ignore[no-any-return]


def parse_timestamp(value: Any) -> Any:
    """botocore's timestamp parser for our clients (botocore parses every listed key's
    timestamp with dateutil, 0.1-0.4 ms each): :func:`_strict_timestamp`, or the text
    itself when unreadable, so the store can say which object it belongs to (an error
    raised inside botocore's parser could not)."""
    try:
        return _strict_timestamp(value)
    except (TypeError, ValueError, OverflowError):
        return value


def listed_time(key: str, value: Any) -> datetime | None:
    """A listed object's LastModified as UTC; None when the server gave none; a
    StorageError naming the object when it is unreadable (never a guess)."""
    if value is None or value == "" or isinstance(value, datetime):
        return utc(value)
    try:
        return _strict_timestamp(value)
    except (TypeError, ValueError, OverflowError):
        raise StorageError("list_objects_v2: unreadable LastModified", key=key) from None


def http_date(value: str | None) -> datetime | None:
    """An HTTP date header as UTC; None when absent or unreadable."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).astimezone(timezone.utc)
    except (TypeError, ValueError):
        return None


def utc(value: Any) -> datetime | None:
    """A server's timestamp as UTC; None for anything else (absent or unreadable)."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc) if value.tzinfo else value.replace(
            tzinfo=timezone.utc
        )
    return None
