"""Delayed messages: written under ``{topic}/delayed/``, moved to ``messages/`` once due.

A delayed message is the message document ``messages/`` would hold, stored at
``{topic}/delayed/{due_ts}-{id}-d{delay_ms}.json`` (:func:`layout.delayed_key`).
pawn-queue 0.1.x lists only ``messages/`` and ``leases/``, so no consumer of either
library sees it before it is moved: consumers' polls move it once due, by the server's
clock (:mod:`.promotion`). ``due_ts`` is the
message's ``created_at`` plus the delay (the publisher's clock unless the caller gave
``created_at``): it orders the keys, soonest first, and makes them deterministic
(publishing one message again overwrites its delayed object).

Costs: a delayed publish is one PUT (as a plain one); a delayed retry one PUT and the
message's DELETE (a packed topic's: its settlement in the segment's lease).
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
from datetime import datetime, timedelta
from typing import Any

from .. import layout
from ..errors import (
    ConditionFailed,
    ObjectNotFound,
    PawnQueueError,
    PayloadError,
    PublishError,
    StorageError,
)
from .context import Context

__all__ = [
    "check_delay",
    "count_delayed",
    "discard_retry",
    "retry_doc",
    "write_delayed",
    "write_retry",
]

log = logging.getLogger(__name__)

#: A retry's ``last_error`` is cut to this many characters (as settle.retry does).
MAX_ERROR_CHARS = 2000
#: publishing.max_delay_seconds' default: 7 days.
DEFAULT_MAX_DELAY_SECONDS = 604800.0


# -- arguments -------------------------------------------------------------------------------


def check_delay(
    delay_seconds: object,
    max_seconds: float = DEFAULT_MAX_DELAY_SECONDS,
    *,
    error: type[PawnQueueError] = PayloadError,
) -> float | None:
    """``delay_seconds`` checked: None (or 0) means no delay; else seconds > 0 up to
    ``max_seconds`` (``publishing.max_delay_seconds``). Anything else (a bool, not a
    number, NaN, infinite, negative, too long) raises ``error`` (PayloadError for a
    publish, InvalidArgument for a retry), before anything is written."""
    if delay_seconds is None:
        return None
    if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, numbers.Real):
        raise error(f"delay_seconds must be a number of seconds or None, not "
                    f"{type(delay_seconds).__name__}")
    try:
        value = float(delay_seconds)
    except (OverflowError, ValueError):
        value = math.inf
    if math.isnan(value) or math.isinf(value):
        raise error(f"delay_seconds must be a finite number, got {delay_seconds!r}")
    if value < 0:
        raise error(f"delay_seconds must be >= 0, got {delay_seconds!r}")
    if value > max_seconds:
        raise error(f"delay_seconds must be <= {max_seconds:g} "
                    f"(publishing.max_delay_seconds), got {delay_seconds!r}")
    return value or None


def _delay_ms(delay: float) -> int:
    """The delay in whole milliseconds, rounded up (never early), at least 1."""
    return max(1, math.ceil(delay * 1000))


# -- writing ---------------------------------------------------------------------------------


def write_delayed(ctx: Context, topic: str, message_key: str, body: bytes,
                  delay: float) -> None:
    """Store the message ``body`` (whose messages/ key would be ``message_key``) as
    delayed by ``delay`` seconds: one PUT. Its key's ``due_ts`` is the message's time
    (``message_key``'s) plus the delay, so publishing the same message (id and
    ``created_at``) again overwrites it rather than adding a second. PublishError if
    the write fails; PayloadError for a time past the calendar's end."""
    parts = layout.message_key_parts(topic, message_key)
    if parts is None:
        raise PayloadError(f"not a message key of {topic!r}: {message_key!r}")
    ts, mid = parts
    key = _delayed_key(topic, layout.parse_sortable_timestamp(ts), mid, delay)
    try:
        ctx.store.put(key, body)
    except StorageError as exc:
        raise PublishError(f"could not publish to {topic!r}: {exc}") from exc
    log.debug("published %s", key)


def retry_doc(body: dict[str, Any], delivery_count: int, error: str | None
              ) -> dict[str, Any]:
    """The document a retry writes: the message ``body``, with ``attempts`` (its
    deliveries so far) and ``last_error``."""
    doc = dict(body)
    doc["attempts"] = delivery_count
    if error is not None:
        doc["last_error"] = error[:MAX_ERROR_CHARS]
    return doc


def write_retry(ctx: Context, topic: str, message_id: str, doc: dict[str, Any],
                delay: float, *, deadline: float | None = None) -> tuple[str, str | None]:
    """Store a retried message's ``doc`` as delayed by ``delay`` seconds from now (the
    caller then removes the message and drops its lease); its delayed key and ETag.
    ``deadline``: the retrying lease's fence (monotonic), so the copy is not written
    after another consumer may hold the message. Raises StorageError if the write
    fails, after removing whatever of it may have landed (nothing else changed: the
    message is where it was, so a copy left would be a second delivery)."""
    key = _delayed_key(topic, ctx.clock.now(), message_id, delay)
    try:
        etag = ctx.store.put(key, layout.canonical_json(doc), deadline=deadline).etag
    except StorageError:
        discard_retry(ctx, topic, key, None)
        raise
    return key, etag


def discard_retry(ctx: Context, topic: str, key: str, etag: str | None) -> None:
    """Remove the delayed copy ``key`` a retry wrote (If-Match ``etag`` where known and
    honoured) when the retry could not remove the message itself (its lease lost, a
    request failed): the message stays where it was and is delivered from there, so
    the copy would deliver it once more. A copy already promoted (a write slower than
    its delay) is removed from ``messages/`` too: the promotion's key follows from the
    delayed one, and the delayed object goes first, so a promoter that has not copied
    it yet no longer can. A failure only logs (the copy then repeats the message once:
    docs/guarantees.md)."""
    name = layout.parse_delayed_key(topic, key)
    promoted = (layout.message_key(topic, name.due_ts, name.message_id)
                if name is not None else None)
    try:
        with contextlib.suppress(ObjectNotFound, ConditionFailed):
            ctx.store.delete(key, if_match=etag if etag and ctx.caps.if_match else None)
        if promoted is not None:
            ctx.store.delete(promoted)
    except ObjectNotFound:
        pass
    except StorageError as exc:
        log.warning("could not remove the delayed copy %s of a failed retry: %s", key, exc)


def _delayed_key(topic: str, when: datetime, message_id: str, delay: float) -> str:
    """The delayed key of a message of time ``when`` delayed by ``delay``: checked to
    parse back (a key the promoter could not read would never be delivered)."""
    try:
        due = layout.sortable_timestamp(when + timedelta(seconds=delay))
    except OverflowError:
        raise PayloadError(f"created_at {when.isoformat()} plus the delay is past the "
                           "calendar's end") from None
    key = layout.delayed_key(topic, due, message_id, _delay_ms(delay))
    if layout.parse_delayed_key(topic, key) is None:
        raise PayloadError(f"created_at {when.isoformat()} plus the delay makes no valid "
                           "key (years 1000-9999 only)")
    return key


def count_delayed(ctx: Context, topic: str, limit: int | None = None) -> tuple[int, bool]:
    """Delayed messages of ``topic`` (due or not; foreign objects under ``delayed/``
    included), and whether the count is exact (False: the listing stopped at
    ``limit``). One LIST per 1,000."""
    listing = ctx.store.list(layout.delayed_prefix(topic), limit=limit)
    return len(listing.objects), not listing.truncated
