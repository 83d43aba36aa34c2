"""Dead letters: reading them (``PawnQueue.dead_letters``) and moving them back to
their topic (``PawnQueue.redrive``), as SQS's message-move task does.

Every writer's dead letter reads: this library's (a nack, a message delivered
``polling.max_delivery_count`` times, a packed topic's message, each with a
``dead_letter`` record), its quarantined objects (not messages: ``payload`` None),
and pawn-queue 0.1.x's (a plain copy of the message, no record: the reason says so).

A move writes the message first, then deletes the dead letter, so a crash between the
two never loses one; at worst the next redrive writes it again (see :func:`redrive`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import attrs

from .. import layout
from ..errors import InvalidArgument, ObjectNotFound, StorageError
from ..storage.base import ObjectInfo
from .context import Context
from .redrive_moves import (
    SegmentsSeen,
    create,
    delete_version,
    lease_etag,
    message_key_for,
    pending_key,
    redriven_doc,
    unsettled_in_segment,
)

log = logging.getLogger(__name__)

__all__ = ["MIN_RATE", "DeadLetter", "RedriveResult", "check_rate", "dead_letters", "iter_keys",
           "redrive"]

#: Keys one listing page of dead letters reads (paged: a topic may hold 100k).
PAGE = 1000
#: The smallest redrive rate (moves per second): one move every 1,000 seconds.
MIN_RATE = 0.001
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NO_RECORD = "no reason recorded (a plain copy of the message: pawn-queue 0.1.x's nack)"


@attrs.frozen
class DeadLetter:
    """One object of ``{topic}/dead-letter/``, read.

    ``payload`` is None when the object is not a readable message (a quarantined
    foreign or corrupt object, unreadable bytes): ``reason`` says why and
    :attr:`redrivable` is False. ``raw`` is the object's JSON dict (None when it is not
    one). Times are ISO 8601 text as written (``dead_lettered_at`` falls back to the
    object's LastModified when no record says). ``etag`` is the version read (a
    redrive deletes only that one).
    """

    id: str | None
    topic: str
    key: str
    payload: Any
    created_at: str | None
    producer_id: str | None
    reason: str
    dead_lettered_at: str | None
    delivery_count: int | None
    consumer_id: str | None
    original_key: str | None
    last_error: str | None
    raw: dict[str, Any] | None = attrs.field(repr=False)
    etag: str = attrs.field(default="", repr=False)

    @property
    def redrivable(self) -> bool:
        """A message a redrive can put back: a JSON message with an id (a UUID that
        names this dead-letter key) and a payload, not a quarantined object."""
        raw = self.raw
        if raw is None or "payload" not in raw or not isinstance(self.id, str):
            return False
        record = raw.get("dead_letter")
        if isinstance(record, dict) and "raw_base64" in record:
            return False  # a quarantined object's bytes, not a message
        return bool(_UUID.fullmatch(self.id)) and self.key == layout.dead_letter_key(
            self.topic, self.id
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (the CLI's ``--json``), without ``raw``."""
        return {f.name: getattr(self, f.name) for f in attrs.fields(DeadLetter)
                if f.name not in ("raw", "etag")}


def read_dead_letter(topic: str, key: str, body: bytes, etag: str = "",
                     last_modified: datetime | None = None) -> DeadLetter:
    """A :class:`DeadLetter` of the object at ``key``; never raises for bad bytes."""
    when = layout.iso(last_modified) if last_modified is not None else None
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        doc, why = None, f"unreadable: not JSON ({type(exc).__name__})"
    else:
        why = "unreadable: not a JSON object"
    if not isinstance(doc, dict):
        return DeadLetter(id=None, topic=topic, key=key, payload=None, created_at=None,
                          producer_id=None, reason=why, dead_lettered_at=when,
                          delivery_count=None, consumer_id=None, original_key=None,
                          last_error=None, raw=None, etag=etag)
    record = doc.get("dead_letter")
    record = record if isinstance(record, dict) else {}
    reason = _text(record.get("reason")) or _NO_RECORD
    if "payload" not in doc:
        reason = f"not a message (no payload): {reason}"
    count = record.get("delivery_count")
    return DeadLetter(
        id=_text(doc.get("id")),
        topic=topic,
        key=key,
        payload=doc.get("payload"),
        created_at=_text(doc.get("created_at")),
        producer_id=_text(doc.get("producer_id")),
        reason=reason,
        dead_lettered_at=_text(record.get("at")) or when,
        delivery_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        consumer_id=_text(record.get("consumer_id")),
        original_key=_text(record.get("original_key")),
        last_error=_text(doc.get("last_error")),
        raw=doc,
        etag=etag,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def iter_keys(ctx: Context, prefix: str, limit: int | None = None,
              page: int = PAGE) -> Iterator[ObjectInfo]:
    """The objects under ``prefix`` in key order, one listing page (``page`` keys) at
    a time: a topic of 100k objects is never held in memory at once."""
    cursor: str | None = None
    seen = 0
    while limit is None or seen < limit:
        want = page if limit is None else min(page, limit - seen)
        listing = ctx.store.list(prefix, limit=want, start_after=cursor)
        yield from listing.objects
        seen += len(listing.objects)
        if not listing.truncated or not listing.objects:
            return
        cursor = listing.objects[-1].key


def dead_letters(ctx: Context, topic: str, limit: int | None = None) -> Iterator[DeadLetter]:
    """Read ``topic``'s dead letters in key order (a LIST per 1,000, a GET each); one
    removed meanwhile is left out, an unreadable one is yielded with ``payload`` None.
    The arguments and the topic are checked at the call, not at the first item."""
    check_limit("limit", limit)
    ctx.require_topic(topic)
    return _read_all(ctx, topic, limit)


def _read_all(ctx: Context, topic: str, limit: int | None) -> Iterator[DeadLetter]:
    for info in iter_keys(ctx, layout.dead_letter_prefix(topic), limit):
        if (big := too_large(ctx, topic, info)) is not None:
            yield big
            continue
        try:
            got = ctx.store.get(info.key)
        except ObjectNotFound:
            continue  # redriven or purged since the listing
        yield read_dead_letter(topic, info.key, got.body, got.etag, got.last_modified)


def largest_readable(ctx: Context) -> int:
    """The largest dead letter read whole, in bytes: a message of the largest payload
    with its records, or a quarantined object of up to 4 x ``max_payload_bytes`` in
    base64 (4/3 as long), with room to spare."""
    return 8 * ctx.config.publishing.max_payload_bytes + 65536


def too_large(ctx: Context, topic: str, info: ObjectInfo) -> DeadLetter | None:
    """A DeadLetter (payload None) for an object too large to read, as its listing
    gives its size (a foreign object of any size, moved aside unread by a claim); None
    for one to read."""
    if info.size <= largest_readable(ctx):
        return None
    return DeadLetter(id=None, topic=topic, key=info.key, payload=None, created_at=None,
                      producer_id=None, reason=f"too large to read ({info.size} bytes)",
                      dead_lettered_at=(layout.iso(info.last_modified)
                                        if info.last_modified is not None else None),
                      delivery_count=None, consumer_id=None, original_key=None,
                      last_error=None, raw=None, etag=info.etag)


def check_limit(name: str, value: int | None) -> None:
    """None, or an int of at least 1 (InvalidArgument otherwise)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be None or an int >= 1, not {value!r}")


# -- redrive ---------------------------------------------------------------------------------


@attrs.frozen
class RedriveResult:
    """What a redrive did: ``moved``, the ids put back (in the order moved);
    ``skipped``, dead-letter key -> why it is not a message to put back (quarantined,
    unreadable), left where it is; ``failed``, key -> the store error (left too, for
    another redrive)."""

    moved: list[str] = attrs.field(factory=list)
    skipped: dict[str, str] = attrs.field(factory=dict)
    failed: dict[str, str] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"moved": list(self.moved), "skipped": dict(self.skipped),
                "failed": dict(self.failed)}


def redrive(ctx: Context, topic: str, max: int | None = None, rate: float | None = None,
            progress: Callable[[int], None] | None = None) -> RedriveResult:
    """Move ``topic``'s dead letters back into ``{topic}/messages/`` (at most ``max``,
    at most ``rate`` per second), in key order (random ids: not oldest first);
    ``progress`` is called with the number examined so far after each one.

    Each move: the message is written, with its id and ``created_at``, its delivery
    records dropped (``attempts`` 0; ``last_error`` goes: the dead letter's reason,
    which carries it, is kept as ``redriven.reason``), under its original key (a
    conditional create, or HEAD then PUT where the server lacks If-None-Match; a
    message already there, from an earlier redrive or a nack interrupted before its
    delete, is pending anyway, unless a consumer leases it: the lease of its id is
    HEAD first, and a leased message already there is a nack or a dead-lettering
    claim in progress, which deletes it next, so that letter is skipped, to redrive
    again later; a lease with no message is one a consumer left after deleting it,
    recorded as ``abandoned_lease`` so the janitor does not count it as a delivery
    of the moved message); then the dead letter is deleted, only the version read
    (If-Match its ETag; elsewhere a HEAD checks it first), so one written again
    meanwhile (the message failed again) stays. A crash between the two leaves the dead
    letter: the next redrive moves it again, delivering it at most once more. Packed
    topics too: their consumers read single messages beside segments; a letter of a
    segment's message moves only once the segment's lease records that message settled
    or the segment is gone (see :func:`.redrive_moves.unsettled_in_segment`: its
    consumer records the settlement after writing the letter, and if it died in between,
    the segment delivers the message again), else it is skipped, to redrive again later.
    """
    check_limit("max", max)
    check_rate(rate)
    ctx.require_topic(topic)
    result = RedriveResult()
    seen: SegmentsSeen = {}  # this pass's reads of a packed topic's segments
    started = ctx.clock.monotonic()
    for examined, info in enumerate(iter_keys(ctx, layout.dead_letter_prefix(topic)), 1):
        if max is not None and len(result.moved) >= max:
            break
        if rate is not None:  # the n-th move no earlier than n / rate after the start
            wait = started + len(result.moved) / rate - ctx.clock.monotonic()
            if wait > 0:
                ctx.clock.sleep(wait)
        try:
            if (big := too_large(ctx, topic, info)) is not None:
                result.skipped[info.key] = f"not a message to put back: {big.reason}"
            else:
                _redrive_one(ctx, topic, info.key, result, seen)
        except StorageError as exc:
            result.failed[info.key] = str(exc)
            log.warning("redrive of %s failed: %s", info.key, exc)
        except (OverflowError, ValueError, UnicodeError) as exc:
            # a letter that reads but cannot be put back (a created_at near the ends of
            # time, NaN or a lone surrogate that the JSON writer refuses): skip it, and
            # go on with the others rather than stop the run at it
            result.skipped[info.key] = (f"cannot be put back: {type(exc).__name__}: "
                                        f"{exc}")
            log.warning("redrive of %s skipped: %s", info.key, exc)
        if progress is not None:
            progress(examined)
    log.info("redrive of %r: %d moved, %d skipped, %d failed", topic, len(result.moved),
             len(result.skipped), len(result.failed))
    return result


def check_rate(rate: float | None) -> None:
    """None, or a finite number of moves per second of at least :data:`MIN_RATE`
    (InvalidArgument otherwise): a smaller one would wait longer than anyone means to
    (1e-9 waits 31 years between moves; 1e-300 overflows the sleep after the first)."""
    if rate is None:
        return
    if (isinstance(rate, bool) or not isinstance(rate, (int, float))
            or not MIN_RATE <= rate < float("inf")):
        raise InvalidArgument(f"rate must be None or a finite number of moves per second "
                              f">= {MIN_RATE}, not {rate!r}")


def _redrive_one(ctx: Context, topic: str, key: str, result: RedriveResult,
                 seen: SegmentsSeen) -> None:
    try:
        got = ctx.store.get(key)
    except ObjectNotFound:
        return  # redriven or purged by someone else since the listing
    dl = read_dead_letter(topic, key, got.body, got.etag, got.last_modified)
    if not dl.redrivable:
        result.skipped[key] = f"not a message to put back: {dl.reason}"
        return
    assert dl.raw is not None and dl.id is not None
    if (wait := unsettled_in_segment(ctx, topic, dl, seen)) is not None:
        result.skipped[key] = wait  # a packed topic's: its segment delivers it again
        return
    target = message_key_for(topic, dl, ctx.clock.now())
    if dl.original_key is None:  # pawn-queue 0.1.x's: its message may still be pending
        target = pending_key(ctx, topic, dl) or target
    doc = redriven_doc(ctx, topic, dl)
    lease = lease_etag(ctx, topic, dl.id)  # BEFORE the create: see below
    if lease is not None:
        # a lease of this id left by a consumer that died after deleting the message:
        # the janitor must not count it as an abandoned delivery of the moved message
        doc["abandoned_lease"] = lease
    if not create(ctx, target, layout.canonical_json(doc)) and lease is not None:
        # the message is still there under a lease: a consumer is dead-lettering it
        # right now (its dead-letter write comes before its message delete, and its
        # lease goes last), so deleting the dead letter would lose it
        result.skipped[key] = ("its message is still there, leased by a consumer (a "
                               "nack in progress?): redrive again later")
        return
    if not delete_version(ctx, key, got.etag):
        log.info("redrive: %s was written again while it was moved (the moved message "
                 "failed again): the new dead letter stays", key)
    result.moved.append(dl.id)
    ctx.emit("redriven", topic, dl.id, delivery_count=dl.delivery_count, error=dl.reason)
