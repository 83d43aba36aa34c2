"""Delayed messages: written under ``{topic}/delayed/``, moved to ``messages/`` once due.

A delayed message is the message document ``messages/`` would hold, stored at
``{topic}/delayed/{due_ts}-{id}-d{delay_ms}.json`` (:func:`layout.delayed_key`).
pawn-queue 0.1.x lists only ``messages/`` and ``leases/``, so no consumer of either
library sees it before it is moved. It is **due** when its LastModified plus
``delay_ms`` is at most the server's time (the LIST's Date; never the client's
clock: with no server time known nothing is promoted), plus one second where the
server gives LastModified to the second, so it is never early. ``due_ts`` (the
message's ``created_at`` plus the delay: the publisher's clock unless the caller
gave ``created_at``) only orders the keys, so a listing from the start meets the
soonest first and can stop early.

**Promotion** (:class:`Promoter`, run by each consumer's poll of a topic at most once
per ``polling.interval_seconds``): one LIST of up to 100 delayed keys from the start,
stopping at the first whose ``due_ts`` is beyond the server's time plus
:data:`SKEW_MARGIN_SECONDS`, and more pages (1,000 each) only while every key listed
is within that horizon, up to :data:`MAX_LISTED_PER_PASS` keys a pass (the next pass
goes on from there, then starts over). No body is read to decide anything. Each due
message is copied to ``messages/{due_ts}-{id}.json`` (``If-None-Match: *`` where the
server honours it), then its delayed object is deleted: a crash between the two
leaves both, and the next promoter's copy finds the message there (or, consumed
meanwhile, writes it again: the one window that repeats a message; none loses one).

Costs: a delayed publish is one PUT (as a plain one); a promotion one COPY and one
DELETE per message; an idle topic one LIST per consumer per poll interval.
"""

from __future__ import annotations

import logging
import math
import numbers
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import attrs

from .. import layout
from ..errors import (
    ConditionFailed,
    ObjectNotFound,
    PawnQueueError,
    PayloadError,
    PublishError,
    StorageError,
)
from ..protocol import lease as leases
from ..storage.base import ObjectInfo
from .context import Context

__all__ = [
    "MAX_LISTED_PER_PASS",
    "SKEW_MARGIN_SECONDS",
    "PromotionPass",
    "Promoter",
    "check_delay",
    "count_delayed",
    "is_due",
    "promote_due",
    "retry_doc",
    "write_delayed",
    "write_retry",
]

log = logging.getLogger(__name__)

#: How far past the server's time a delayed key's ``due_ts`` (the publisher's clock)
#: may be while a promotion still looks at it: publishers' clocks ahead of the
#: server's by up to this much still have their messages delivered on time.
SKEW_MARGIN_SECONDS = 300.0
#: The first LIST of a promotion pass: an idle topic's every-interval cost.
FIRST_PAGE = 100
#: Later LISTs of a pass (a backlog of due messages).
PAGE = 1000
#: Most delayed keys one pass lists (3 LISTs); the next pass starts after the last.
MAX_LISTED_PER_PASS = FIRST_PAGE + 2 * PAGE
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
                delay: float) -> str:
    """Store a retried message's ``doc`` as delayed by ``delay`` seconds from now (the
    caller then removes the message and drops its lease); its delayed key. Raises
    StorageError if the write fails (nothing else changed)."""
    key = _delayed_key(topic, ctx.clock.now(), message_id, delay)
    ctx.store.put(key, layout.canonical_json(doc))
    return key


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


# -- promotion -------------------------------------------------------------------------------


def is_due(last_modified: datetime | None, delay_ms: int, now: datetime | None) -> bool:
    """Whether a delayed object written at ``last_modified`` (the server's) with
    ``delay_ms`` is due at the server's time ``now``. Unknown times are never due. A
    LastModified given to the second (no fraction: S3's) may be up to a second before
    the write, so a second is added: never early, at most a second late."""
    if last_modified is None or now is None:
        return False
    slack = timedelta(seconds=1) if last_modified.microsecond == 0 else timedelta(0)
    return last_modified + timedelta(milliseconds=delay_ms) + slack <= now


@attrs.frozen
class PromotionPass:
    """What one pass did: messages moved to ``messages/``, delayed keys listed, LISTs
    made, where the next pass starts (None: from the start), and whether another
    promoter held the topic's lock (then this pass moved nothing)."""

    promoted: int
    listed: int
    lists: int
    cursor: str | None
    locked_out: bool = False


def promote_due(ctx: Context, topic: str, *, start_after: str | None = None,
                max_listed: int = MAX_LISTED_PER_PASS,
                rng: random.Random | None = None) -> PromotionPass:
    """Move the due delayed messages of ``topic`` to ``messages/`` (see the module):
    one pass from ``start_after`` (None: the start), under the topic's promotion lock
    once it has found one due. Raises StorageError if a LIST fails; a failed move
    only logs (the message stays delayed for the next pass)."""
    store = ctx.store
    prefix = layout.delayed_prefix(topic)
    promoted = listed = lists = 0
    limit = FIRST_PAGE if start_after is None else PAGE
    lock: PromotionLock | None = None
    try:
        while True:
            listing = store.list(prefix, limit=min(limit, max_listed - listed),
                                 start_after=start_after)
            lists += 1
            now = listing.server_time
            if now is None and listing.objects:
                now = store.server_time()
            if now is None:  # no server time: nothing can be judged due
                return PromotionPass(promoted, listed, lists, None)
            due, beyond = _due_in(topic, listing.objects, now)
            listed += len(listing.objects)
            if due and lock is None:
                lock = PromotionLock.take(ctx, topic, now)
                if lock is None:  # another promoter is at it: its pass moves them
                    return PromotionPass(promoted, listed, lists, start_after, True)
            if due:
                assert lock is not None
                promoted += _promote_all(ctx, topic, due, lock, rng or random.Random())
            if beyond or not listing.truncated or not listing.objects:
                return PromotionPass(promoted, listed, lists, None)
            start_after = listing.objects[-1].key
            if listed >= max_listed or (lock is not None and not lock.fresh()):
                return PromotionPass(promoted, listed, lists, start_after)
            limit = PAGE
    finally:
        if lock is not None:
            lock.release()


def _due_in(topic: str, objects: list[ObjectInfo], now: datetime
            ) -> tuple[list[tuple[str, layout.DelayedName]], bool]:
    """The due delayed messages among a page of ``objects`` at the server's time
    ``now``, and whether the page reached a key beyond the horizon (the rest are)."""
    horizon = now + timedelta(seconds=SKEW_MARGIN_SECONDS)
    due: list[tuple[str, layout.DelayedName]] = []
    for info in objects:
        name = layout.parse_delayed_key(topic, info.key)
        if name is None:
            continue  # a foreign object: left alone
        if layout.parse_sortable_timestamp(name.due_ts) > horizon:
            return due, True
        if is_due(info.last_modified, name.delay_ms, now):
            due.append((info.key, name))
    return due, False


@attrs.define
class PromotionLock:
    """A topic's promotion lock (``layout.delayed_lock_key``), held while its due
    messages are moved: two promoters at once could otherwise write a message again
    after its first copy was consumed (a copy listed before the other's delete). A
    conditional create; stale (taken over) a visibility timeout after it was written,
    by the server's clock, as a lease; its holder moves messages only within that time
    less the fence margin. A server without If-None-Match gets no lock (``token``
    empty): promoters there may repeat a message (docs/guarantees.md)."""

    ctx: Context
    key: str
    token: str
    #: monotonic time just before the write that took it
    written_at: float

    @classmethod
    def take(cls, ctx: Context, topic: str, now: datetime) -> PromotionLock | None:
        """The lock, or None while another promoter holds it (live at the server's
        time ``now``); one held past its staleness is taken over."""
        key = layout.delayed_lock_key(topic)
        started = ctx.clock.monotonic()
        if not ctx.caps.if_none_match:
            return cls(ctx, key, "", started)
        body = layout.canonical_json({"at": layout.iso(ctx.clock.now())})
        for _ in range(2):
            started = ctx.clock.monotonic()
            try:
                return cls(ctx, key, ctx.store.put(key, body, if_none_match=True).etag,
                           started)
            except ConditionFailed:
                pass
            try:
                held = ctx.store.head(key)
                if not leases.is_stale(held.last_modified, now, ctx.visibility):
                    return None
                ctx.store.delete(key, if_match=held.etag)  # its holder died: ours now
            except (ObjectNotFound, ConditionFailed):
                return None  # released or taken over meanwhile: a later pass
        return None

    def fresh(self) -> bool:
        """Still certainly ours: moves may start (the fence of a lease)."""
        if not self.token:
            return True
        ends = self.written_at + self.ctx.visibility - self.ctx.fence_margin()
        return self.ctx.clock.monotonic() < ends

    def release(self) -> None:
        """Give it back (only our version); a failure only logs: it goes stale."""
        if not self.token:
            return
        try:
            self.ctx.store.delete(self.key, if_match=self.token)
        except StorageError as exc:
            log.warning("could not release %s: %s", self.key, exc)


def _promote_all(ctx: Context, topic: str, due: list[tuple[str, layout.DelayedName]],
                 lock: PromotionLock, rng: random.Random) -> int:
    """Move ``due`` (in a random order) in parallel on the claim pool while ``lock``
    is fresh; how many this call moved."""
    rng.shuffle(due)

    def move(item: tuple[str, layout.DelayedName]) -> bool:
        return lock.fresh() and _promote_one(ctx, topic, *item)

    if len(due) == 1:
        return int(move(due[0]))
    pool = ctx.pool("claim", ctx.config.polling.claim_threads)
    return sum(int(f.result()) for f in [pool.submit(move, item) for item in due])


def _promote_one(ctx: Context, topic: str, key: str, name: layout.DelayedName) -> bool:
    """Copy one due delayed message to ``messages/``, then delete its delayed object.
    False when another promoter moved it first (or the store failed: logged)."""
    store = ctx.store
    dst = layout.message_key(topic, name.due_ts, name.message_id)
    try:
        try:
            store.copy(key, dst, if_none_match=ctx.caps.if_none_match)
        except ObjectNotFound:
            return False  # moved by another promoter (its delete came first)
        except ConditionFailed:
            pass  # copied by a promoter that died before its delete: finish its move
        store.delete(key)
    except StorageError as exc:
        log.warning("could not promote delayed message %s: %s", key, exc)
        return False
    log.debug("promoted %s to %s", key, dst)
    return True


@attrs.define
class _TopicPromotion:
    """A consumer's promotion of one topic: when (monotonic) it last ran, and the
    key its next pass starts after."""

    at: float = -math.inf
    cursor: str | None = None


class Promoter:
    """One consumer's promotion of its topics' due delayed messages, run by its polls:
    at most one pass per topic per ``polling.interval_seconds`` (no lock: two threads
    polling at once may both pass, which only costs a LIST)."""

    def __init__(self, ctx: Context, on_promoted: Callable[[str, int], None] | None = None
                 ) -> None:
        self._ctx = ctx
        self._topics: dict[str, _TopicPromotion] = {}
        self._rng = random.Random()
        #: told (topic, count) after a pass that moved messages
        self._on_promoted = on_promoted

    def run_due(self, topic: str) -> int:
        """A pass over ``topic`` if none ran within a poll interval; how many messages
        it moved. A failure only logs (the next pass, an interval later, tries again)."""
        state = self._topics.get(topic)
        if state is None:
            state = self._topics.setdefault(topic, _TopicPromotion())
        now = self._ctx.clock.monotonic()
        if now - state.at < self._ctx.config.polling.interval_seconds:
            return 0
        state.at = now
        try:
            result = promote_due(self._ctx, topic, start_after=state.cursor, rng=self._rng)
        except StorageError as exc:
            log.warning("could not list delayed messages of %r: %s", topic, exc)
            return 0
        state.cursor = result.cursor
        if result.promoted and self._on_promoted is not None:
            self._on_promoted(topic, result.promoted)
        return result.promoted


def count_delayed(ctx: Context, topic: str, limit: int | None = None) -> tuple[int, bool]:
    """Delayed messages of ``topic`` (due or not; foreign objects under ``delayed/``
    included), and whether the count is exact (False: the listing stopped at
    ``limit``). One LIST per 1,000."""
    listing = ctx.store.list(layout.delayed_prefix(topic), limit=limit)
    return len(listing.objects), not listing.truncated
