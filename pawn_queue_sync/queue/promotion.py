"""Promotion of delayed messages (:mod:`.delayed`): due ones moved to ``messages/``.

A delayed message is **due** when its LastModified plus ``delay_ms`` is at most the
server's time (the LIST's Date; never the client's clock: with no server time known
nothing is promoted), plus one second where the server gives LastModified to the
second, so it is never early. Its key's ``due_ts`` only orders the keys, so a listing
from the start meets the soonest first and can stop early.

A pass (:func:`promote_due`; :class:`Promoter` runs one per topic at most once per
``polling.interval_seconds`` from each consumer's polls): one LIST of up to 100 delayed
keys from the start, stopping at the first whose ``due_ts`` is beyond the server's time
plus :data:`SKEW_MARGIN_SECONDS`, and more pages (1,000 each) only while every key
listed is within that horizon, up to :data:`MAX_LISTED_PER_PASS` keys a pass (the next
pass goes on from there, then starts over). No body is read to decide anything. Under
the topic's :class:`PromotionLock`, each due message is copied to
``messages/{due_ts}-{id}.json`` (``If-None-Match: *`` where the server honours it),
then its delayed object is deleted: a crash between the two leaves both, and the next
pass's copy finds the message there (or, consumed meanwhile, writes it again: the
window that repeats a message, docs/guarantees.md; none loses one).

Costs: one COPY and one DELETE per message; the lock's PUT and DELETE per pass that
finds some due. An idle topic's pass costs nothing of its own: it reads the first
page of the idle poll's one LIST (:mod:`.idle`), so an idle topic costs one LIST per
consumer per poll interval in all.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable
from datetime import datetime, timedelta

import attrs

from .. import layout
from ..errors import ConditionFailed, ObjectNotFound, StorageError
from ..protocol import lease as leases
from ..storage.base import Listing, ObjectInfo
from .context import Context

__all__ = [
    "FIRST_PAGE",
    "MAX_LISTED_PER_PASS",
    "PAGE",
    "SKEW_MARGIN_SECONDS",
    "PromotionLock",
    "PromotionPass",
    "Promoter",
    "is_due",
    "promote_due",
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
#: The longest lifetime a promotion lock's body may state (a lock claiming more is
#: still taken over after this, unless the reader's own is longer): 7 days.
MAX_LOCK_LIFETIME_SECONDS = 604800.0


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
                rng: random.Random | None = None,
                first: Listing | None = None) -> PromotionPass:
    """Move the due delayed messages of ``topic`` to ``messages/`` (see the module):
    one pass from ``start_after`` (None: the start), under the topic's promotion lock
    once it has found one due. ``first``: the pass's first page, already listed (an
    idle poll's, :mod:`.idle`: the first delayed keys, ``truncated`` if more may
    follow). Raises StorageError if a LIST fails; a failed move only logs (the
    message stays delayed for the next pass)."""
    store = ctx.store
    prefix = layout.delayed_prefix(topic)
    promoted = listed = lists = 0
    limit = FIRST_PAGE if start_after is None else PAGE
    lock: PromotionLock | None = None
    try:
        while True:
            if first is not None:
                listing, first = first, None
            else:
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
    conditional create; stale (taken over) its holder's visibility timeout, which its
    body states, after it was written, by the server's clock, as a lease; its holder
    moves messages only within that time less the fence margin. A server without
    If-None-Match gets no lock (``token``
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
        body = layout.canonical_json({"at": layout.iso(ctx.clock.now()),
                                      "lifetime_seconds": ctx.visibility})
        for _ in range(2):
            started = ctx.clock.monotonic()
            try:
                return cls(ctx, key, ctx.store.put(key, body, if_none_match=True).etag,
                           started)
            except ConditionFailed:
                pass
            try:
                held = ctx.store.get(key)
                if not leases.is_stale(held.last_modified, now,
                                       _lifetime(held.body, ctx.visibility)):
                    return None
                ctx.store.delete(key, if_match=held.etag)  # its holder died: ours now
            except (ObjectNotFound, ConditionFailed):
                return None  # released or taken over meanwhile: a later pass
        return None

    def fresh(self) -> bool:
        """Still certainly ours: moves may start (the fence of a lease, within the
        lifetime its body states)."""
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


def _lifetime(body: bytes, default: float) -> float:
    """How long a promotion lock lives, as its holder stated in its body (its
    visibility timeout: consumers configured with another one judge it by the
    holder's); ``default`` for a lock without it (an older version's, unreadable, or a
    foreign body of any shape: nested past the recursion limit, a number no float
    holds; nothing a body holds may break the poll that reads it)."""
    try:
        value = json.loads(body).get("lifetime_seconds")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return default
        lifetime = float(value)
    except Exception:  # any foreign body: ValueError, RecursionError, OverflowError...
        return default
    if not lifetime > 0:  # NaN too; inf is capped below
        return default
    return min(lifetime, max(MAX_LOCK_LIFETIME_SECONDS, default))


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
    """A consumer's promotion of one topic: when (monotonic) it last ran, the key its
    next pass starts after, and how many passes in a row failed."""

    at: float = -math.inf
    cursor: str | None = None
    failures: int = 0


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

    def run_due(self, topic: str, first: Listing | None = None) -> int:
        """A pass over ``topic`` if none ran within a poll interval; how many messages
        it moved. ``first``: an idle poll's page of the first delayed keys, the pass's
        first LIST (unless a cut pass is to go on from where it stopped). Idle or not,
        a pass waits for the interval: one that finds something due takes the lock (a
        PUT, and a GET while another holds it), which a tight loop of idle polls must
        not pay on every poll. A failure only
        logs (the next pass, an interval later, tries again): the first at INFO (a
        store failing this listing fails the poll too, which warns), a second in a
        row as a WARNING; any other error (never raised out of the poll, whose claims
        on other topics it would strand) as a WARNING."""
        state = self._topics.get(topic)
        if state is None:
            state = self._topics.setdefault(topic, _TopicPromotion())
        if state.cursor is not None:
            first = None  # go on from where the last pass stopped
        now = self._ctx.clock.monotonic()
        if now - state.at < self._ctx.config.polling.interval_seconds:
            return 0
        state.at = now
        try:
            result = promote_due(self._ctx, topic, start_after=state.cursor, rng=self._rng,
                                 first=first)
        except StorageError as exc:
            state.failures += 1
            log.log(logging.WARNING if state.failures > 1 else logging.INFO,
                    "could not list delayed messages of %r (%d time(s) in a row): %s",
                    topic, state.failures, exc)
            return 0
        except Exception as exc:  # a foreign object's body, a bug: the poll goes on
            state.failures += 1
            log.warning("promotion of delayed messages of %r failed (%d time(s) in a row): "
                        "%s: %s", topic, state.failures, type(exc).__name__, str(exc)[:200])
            return 0
        state.cursor, state.failures = result.cursor, 0
        if result.promoted and self._on_promoted is not None:
            self._on_promoted(topic, result.promoted)
        return result.promoted
