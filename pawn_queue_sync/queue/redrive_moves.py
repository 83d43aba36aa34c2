"""The writes of one redrive move (see :func:`~pawn_queue_sync.queue.deadletters.redrive`):
whether a packed topic's letter may move yet, where the message goes, what is written,
the conditional create, the lease HEAD, and the delete of the dead letter's version
read."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from .. import layout
from ..errors import ConditionFailed, ObjectNotFound, SegmentError
from ..protocol.segments import Progress, SegmentLease
from .context import Context
from .topics import _put_once as put_once  # the same create as a topic marker's

if TYPE_CHECKING:
    from .deadletters import DeadLetter

log = logging.getLogger("pawn_queue_sync.queue.deadletters")

__all__ = ["SegmentsSeen", "create", "delete_version", "lease_etag", "message_key_for",
           "pending_key", "redriven_doc", "unsettled_in_segment"]

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
#: Why a packed topic's letter is left for now (see :func:`unsettled_in_segment`).
IN_SEGMENT = ("its message is not recorded settled in its segment (a nack in progress, or "
              "its consumer died before recording it: the segment delivers it again): "
              "redrive again later")


#: A segment :func:`unsettled_in_segment` found gone (no lease, no segment): for good.
_GONE = "gone"
#: A segment there without a readable lease: its letters wait (for this pass only).
_WAITING = "waiting"
#: What one redrive pass read of its topic's segments, by segment id: the progress its
#: lease recorded, or :data:`_GONE` / :data:`_WAITING`. Kept for ONE pass only: each
#: answer may go stale, but only in the direction that lets more letters move (a
#: recorded settlement is never undone, a gone segment never comes back), so a letter
#: judged on it moves only when a fresh read would move it too; one that waits on it
#: waits until the next pass.
SegmentsSeen = dict[str, "Progress | str"]


def unsettled_in_segment(ctx: Context, topic: str, dl: DeadLetter,
                         seen: SegmentsSeen | None = None) -> str | None:
    """Why ``dl``, a packed topic's dead letter, must not move yet; None when it may
    (at once for a letter that names no segment of ``topic``).

    A packed topic's consumer writes a message's dead letter (a nack, or
    ``max_delivery_count`` reached), THEN records the message settled in its segment's
    lease; one that dies in between leaves it unsettled there, and the segment's next
    holder delivers it again: a redriven copy would be delivered beside it, both held
    at once. A packed message has no lease of its own for :func:`lease_etag` to see,
    so the letter moves only once its segment's lease records its message
    (``segment_index``) settled, or the segment is gone (finished or purged): both
    last. One GET of the segment's lease; a HEAD of the segment when that is gone (a
    segment without a lease is claimed afresh, every message delivered again): once per
    segment and pass, given the pass's ``seen`` (see :data:`SegmentsSeen`)."""
    segment = dl.original_key or ""
    parsed = layout.parse_segment_key(topic, segment)
    if parsed is None:
        return None
    sid, count = parsed
    record = dl.raw.get("dead_letter") if dl.raw is not None else None
    index = record.get("segment_index") if isinstance(record, dict) else None
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        index = None  # which message it was is unknown: it moves once the segment is gone
    state = seen.get(sid) if seen is not None else None
    if state is None:
        state = _segment_state(ctx, topic, sid, segment)
        if seen is not None:
            seen[sid] = state
    if state == _GONE:
        return None
    if isinstance(state, Progress) and index is not None and state.is_settled(index):
        return None
    return IN_SEGMENT


def _segment_state(ctx: Context, topic: str, sid: str, segment: str) -> Progress | str:
    """What the segment's lease recorded (one GET), else whether the segment is gone (a
    HEAD): an unreadable lease tells nothing (its next holder takes it over afresh)."""
    try:
        body = ctx.store.get(layout.segment_lease_key(topic, sid)).body
    except ObjectNotFound:
        try:
            ctx.store.head(segment)
        except ObjectNotFound:
            return _GONE
        return _WAITING
    try:
        return SegmentLease.decode(body).progress
    except SegmentError:
        return _WAITING


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

