"""The writes of one redrive move (see :func:`~pawn_queue_sync.queue.deadletters.redrive`):
where the message goes, what is written, the conditional create, the lease HEAD, and
the delete of the dead letter's version read."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from .. import layout
from ..errors import ConditionFailed, ObjectNotFound
from .context import Context
from .topics import _put_once as put_once  # the same create as a topic marker's

if TYPE_CHECKING:
    from .deadletters import DeadLetter

log = logging.getLogger("pawn_queue_sync.queue.deadletters")

__all__ = ["create", "delete_version", "lease_etag", "message_key_for", "pending_key",
           "redriven_doc"]

#: How far from its ``created_at`` a pawn-queue 0.1.x message's key is looked for.
NEAR = timedelta(seconds=2)
#: Keys per listing page that look, and the most pages (a topic publishing > 1,000 a
#: second around then).
NEAR_PAGE = 1000
NEAR_PAGES = 5
#: The longest dead-letter reason kept in a redriven message's ``redriven`` record.
REASON_KEPT = 500
#: A message's delivery records, dropped by a redrive (it starts again at 0 attempts).
_DELIVERY_FIELDS = ("attempts", "last_error", "abandoned_lease", "dead_letter", "redriven")


def pending_key(ctx: Context, topic: str, dl: DeadLetter) -> str | None:
    """The key of a message of ``dl``'s id still under ``messages/`` near its
    ``created_at`` (None when none is found): pawn-queue 0.1.x names a message's key
    from another clock reading than its ``created_at`` (microseconds apart) and its
    nack copies, then deletes; a copy whose delete did not happen is pending under a
    key the dead letter does not name. A LIST of the keys within :data:`NEAR` of it
    (at most :data:`NEAR_PAGES` pages)."""
    when = _created(dl)
    if when is None or dl.id is None:
        return None
    prefix = layout.messages_prefix(topic)
    low = layout.sortable_timestamp(when - NEAR)
    high = layout.sortable_timestamp(when + NEAR)
    cursor: str | None = prefix + low
    for _ in range(NEAR_PAGES):
        listing = ctx.store.list(prefix, limit=NEAR_PAGE, start_after=cursor)
        for info in listing.objects:
            if info.key[len(prefix):len(prefix) + len(high)] > high:
                return None
            if layout.parse_message_key(topic, info.key) == dl.id:
                return info.key
        if not listing.truncated or not listing.objects:
            return None
        cursor = listing.objects[-1].key
    return None


def _created(dl: DeadLetter) -> datetime | None:
    """``dl.created_at`` as an aware datetime (UTC when it names no zone), or None."""
    if not dl.created_at:
        return None
    try:
        parsed = datetime.fromisoformat(dl.created_at)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def message_key_for(topic: str, dl: DeadLetter, now: datetime) -> str:
    """Where a redriven message goes: its original key when the dead letter names one
    of this topic for its id (plain topics), else a key from its ``created_at`` (packed
    topics, pawn-queue's dead letters), else from ``now``. A fixed key makes a repeated
    move find the first one's copy instead of writing a second."""
    assert dl.id is not None
    original = dl.original_key
    if original is not None and layout.parse_message_key(topic, original) == dl.id:
        return original
    return layout.message_key(topic, layout.sortable_timestamp(_created(dl) or now), dl.id)


def redriven_doc(ctx: Context, topic: str, dl: DeadLetter) -> dict[str, Any]:
    """The message a redrive writes: the dead letter's fields without delivery records,
    and ``redriven`` (when, how many times so far, the reason it was dead-lettered)."""
    assert dl.raw is not None
    doc = {k: v for k, v in dl.raw.items() if k not in _DELIVERY_FIELDS}
    doc["topic"] = topic
    before = dl.raw.get("redriven")
    times = before.get("times", 0) if isinstance(before, dict) else 0
    doc["redriven"] = {
        "at": layout.iso(ctx.clock.now()),
        "times": (times if isinstance(times, int) else 0) + 1,
        "reason": dl.reason[:REASON_KEPT],
        "delivery_count": dl.delivery_count,
    }
    return doc


def create(ctx: Context, key: str, body: bytes) -> bool:
    """Write ``key`` unless it exists (the copy of an earlier move, pending): False
    when it existed (and was kept as it is)."""
    if put_once(ctx, key, body):
        return True
    log.info("redrive: %s exists already: kept", key)
    return False


def lease_etag(ctx: Context, topic: str, mid: str) -> str | None:
    """The ETag of message ``mid``'s lease object, None when it has none (one HEAD)."""
    try:
        return ctx.store.head(layout.lease_key(topic, mid)).etag
    except ObjectNotFound:
        return None


def delete_version(ctx: Context, key: str, etag: str) -> bool:
    """Delete the dead letter at ``key`` while it is version ``etag``: True when
    deleted (or gone), False when another version is there."""
    try:
        if ctx.caps.if_match and etag:
            ctx.store.delete(key, if_match=etag)
        else:  # no If-Match on this server: check, then delete (a narrow race)
            if ctx.store.head(key).etag != etag:
                return False
            ctx.store.delete(key)
    except ObjectNotFound:
        return True
    except ConditionFailed:
        try:
            ctx.store.head(key)
        except ObjectNotFound:
            return True  # removed by another redrive or a purge
        return False
    return True

