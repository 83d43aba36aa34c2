"""Removing what a topic holds: ``PawnQueue.purge`` (its dead letters, or its pending
messages) and ``PawnQueue.delete_topic``.

Nothing leased is purged: a message (or a packed topic's segment) whose lease is
listed just before the page of messages it is on is kept, so a handler at work never
loses its message under it; deletes name the version listed (If-Match per key in
DeleteObjects where the server honours it), so an object rewritten since the listing
stays. A segment given back (its lease ``released``) is purged, then its lease (the
version read: one taken over since stays).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from .. import layout
from ..errors import InvalidArgument, ObjectNotFound, SegmentError, StorageError, TopicNotEmptyError
from ..protocol import lease as leases
from ..protocol.effects import run
from ..protocol.lease import is_stale
from ..protocol.segments import Progress, SegmentLease
from ..storage.base import DELETE_BATCH
from .context import Context
from .deadletters import iter_keys

log = logging.getLogger(__name__)

__all__ = ["SECTIONS", "Section", "delete_topic", "purge"]

Section = Literal["dead-letter", "messages"]
SECTIONS: tuple[str, ...] = ("dead-letter", "messages")


def purge(ctx: Context, topic: str, section: str = "dead-letter",
          progress: Callable[[int], None] | None = None) -> int:
    """Delete ``topic``'s dead letters (``section="dead-letter"``) or its pending
    messages (``"messages"``: single messages and, on a packed topic, segments); the
    number of messages deleted (a segment counts its messages). ``progress`` is called
    with the running count after each page.

    Leased messages and segments are kept: the leases are listed again before each page
    (a page is 1,000 keys: one LIST of messages, one of leases, one DeleteObjects). A
    message claimed in the moment between that lease listing and the delete may be
    deleted under its handler: its ack then finds it gone (done), and a retry does not
    write it back where the server honours If-Match.
    """
    if section not in SECTIONS:
        raise InvalidArgument(f"section must be one of {', '.join(SECTIONS)}, not {section!r}")
    ctx.require_topic(topic)
    if section == "dead-letter":
        done = _purge_pages(ctx, layout.dead_letter_prefix(topic), lambda _k: 1, None, progress)
    else:
        def message(key: str) -> int:
            return 1 if layout.parse_message_key(topic, key) is not None else 0

        done = _purge_pages(
            ctx, layout.messages_prefix(topic), message,
            lambda: _leased(ctx, topic, layout.leases_prefix(topic), layout.lease_message_id),
            progress, id_of=lambda key: layout.parse_message_key(topic, key),
        )
        if ctx.topic_packed(topic):
            given_back: dict[str, tuple[Progress, str]] = {}

            def segment(key: str) -> int:
                """Its messages not settled (all of them unless its lease was given
                back with progress recorded)."""
                parsed = layout.parse_segment_key(topic, key)
                if parsed is None:
                    return 0
                sid, count = parsed
                back = given_back.get(sid)
                if back is None:
                    return count
                return sum(1 for i in range(count) if not back[0].is_settled(i))

            def segment_id(key: str) -> str | None:
                parsed = layout.parse_segment_key(topic, key)
                return parsed[0] if parsed is not None else None

            def leases_of(deleted: list[str]) -> None:
                """The given-back leases of the segments just deleted: nothing to hold."""
                for key in deleted:
                    sid = segment_id(key)
                    if sid is not None and sid in given_back:
                        _remove_lease(ctx, layout.segment_lease_key(topic, sid),
                                      given_back[sid][1])

            done = _purge_pages(
                ctx, layout.segments_prefix(topic), segment,
                lambda: _held_segments(ctx, topic, given_back),
                progress, done, id_of=segment_id, deleted=leases_of,
            )
    log.info("purged %d from %s of %r", done, section, topic)
    return done


def _leased(ctx: Context, topic: str, prefix: str,
            name_of: Callable[[str, str], str | None]) -> set[str]:
    """The ids (message or segment) that have a lease, stale ones included (a janitor
    reaps those; until then they count as held)."""
    return {n for o in ctx.store.list(prefix).objects
            if (n := name_of(topic, o.key)) is not None}


def _held_segments(ctx: Context, topic: str,
                   given_back: dict[str, tuple[Progress, str]]) -> set[str]:
    """The ids of ``topic``'s segments held by a consumer: a segment lease, stale or
    not, that is not given back (``released``; unreadable counts as held). The given
    back ones go into ``given_back`` with what their consumers settled and the lease
    version read (its ETag). A LIST and a GET per segment lease."""
    given_back.clear()
    held: set[str] = set()
    for info in ctx.store.list(layout.segment_leases_prefix(topic)).objects:
        sid = layout.segment_lease_id(topic, info.key)
        if sid is None:
            continue
        try:
            got = ctx.store.get(info.key)
            lease = SegmentLease.decode(got.body)
        except ObjectNotFound:
            continue  # given back and removed since the listing
        except SegmentError:
            held.add(sid)  # cannot tell: kept
            continue
        if lease.released:
            given_back[sid] = (lease.progress, got.etag)
        else:
            held.add(sid)
    return held


def _remove_lease(ctx: Context, key: str, etag: str) -> None:
    """Delete the given-back lease ``key`` of a segment purged, if it is still version
    ``etag`` (If-Match; a HEAD first where the server lacks it): a consumer that took
    the segment over since keeps its lease (its holder's to remove: a claim that finds
    the segment gone drops it). Left, a given-back lease would count as live until
    stale (delete_topic refuses the topic meanwhile), then be reaped by a poll."""
    try:
        run(leases.reap(key, etag, ctx.caps, ctx.csprng), ctx.store, ctx.clock)
    except ObjectNotFound:
        pass
    except StorageError as exc:
        log.warning("purge: could not remove the lease %s of a segment purged: %s", key, exc)


def _purge_pages(ctx: Context, prefix: str, weight: Callable[[str], int],
                 leased: Callable[[], set[str]] | None,
                 progress: Callable[[int], None] | None, done: int = 0,
                 id_of: Callable[[str], str | None] = lambda _k: None,
                 deleted: Callable[[list[str]], None] | None = None) -> int:
    """Delete the objects under ``prefix`` page by page, except those whose id
    (``id_of``) is in ``leased()`` (listed after each page); ``weight`` counts an
    object's messages (0: a foreign key, left for the consumers' quarantine);
    ``deleted`` is called with each page's keys deleted."""
    cursor: str | None = None
    while True:
        listing = ctx.store.list(prefix, limit=1000, start_after=cursor)
        if not listing.objects:
            return done
        cursor = listing.objects[-1].key
        held = leased() if leased is not None else set()
        batch = {o.key: o for o in listing.objects
                 if weight(o.key) and (not held or id_of(o.key) not in held)}
        if batch:
            etags = ({k: o.etag for k, o in batch.items() if o.etag}
                     if ctx.caps.if_match else None)
            failed = set(ctx.store.delete_many(list(batch),
                                               **({"etags": etags} if etags else {})))
            gone = [k for k in batch if k not in failed]
            done += sum(weight(k) for k in gone)
            if deleted is not None:
                deleted(gone)
        if progress is not None:
            progress(done)
        if not listing.truncated:
            return done


# -- delete_topic ---------------------------------------------------------------------------


def delete_topic(ctx: Context, topic: str, force: bool = False) -> int:
    """Delete ``topic``: its marker, its manifest and everything under it; the number
    of objects deleted. Without ``force``, raises :class:`TopicNotEmptyError` while it
    holds messages, segments, dead letters, delayed messages or live leases (by the
    server's clock), and then deletes only its stale leases, its dedup markers, its
    manifest, a promotion lock left behind and its marker (last): a message
    published meanwhile by a process that knew the topic stays (invisible until the
    topic is created again), never deleted unseen. With ``force``, everything under
    ``{topic}/`` goes, page by page, the marker last (a crash leaves a topic to delete
    again). Consumers still polling it then fail with TopicNotFoundError once they
    look again; processes that cached it as packed keep that until restarted."""
    if not isinstance(force, bool):
        raise InvalidArgument(f"force must be True or False, not {force!r}")
    ctx.require_topic(topic)
    marker = layout.topic_marker_key(topic)
    manifest = layout.packed_manifest_key(topic)
    lock = layout.delayed_lock_key(topic)  # a dead promoter's (none delayed are left)
    if force:
        keep = {marker}

        def doomed(key: str) -> bool:
            return key not in keep
    else:
        _check_empty(ctx, topic)
        garbage = (layout.leases_prefix(topic), layout.segment_leases_prefix(topic),
                   layout.dedup_prefix(topic))  # dedup markers: nobody would expire them

        def doomed(key: str) -> bool:
            return key.startswith(garbage) or key in (manifest, lock)
    deleted = 0
    batch: list[str] = []
    for info in iter_keys(ctx, f"{topic}/"):
        if doomed(info.key):
            batch.append(info.key)
        if len(batch) >= DELETE_BATCH:
            deleted += _delete(ctx, batch)
            batch = []
    deleted += _delete(ctx, batch)
    ctx.store.delete(marker)
    ctx.forget_topic(topic)
    log.info("deleted topic %r (%d objects)", topic, deleted + 1)
    return deleted + 1


def _delete(ctx: Context, keys: list[str]) -> int:
    """Delete ``keys`` (one DeleteObjects); a key that could not be: StorageError."""
    if not keys:
        return 0
    failed = ctx.store.delete_many(keys)
    if failed:
        raise StorageError(f"could not delete {len(failed)} object(s); delete_topic again",
                           key=failed[0])
    return len(keys)


#: The order :func:`_check_empty` lists the sections in, after the leases. Every move
#: of a message between sections writes its new place before it removes the old one:
#: promotion (delayed -> messages), redrive (dead-letter -> messages), nack (messages
#: or segments -> dead-letter), retry with a delay (messages or segments -> delayed).
#: A move is seen when its source is listed before its destination (listed before the
#: removal: found there; after it: the destination already holds it), so each of
#: those pairs appears in this order, and ``messages/`` once more after the second
#: ``delayed/``: a message retried with a delay and promoted back during the check
#: (two moves) is seen there. 7 LISTs (limit 1).
_CHECK_ORDER: tuple[tuple[str, str], ...] = (
    ("dead letters", layout.DEAD_LETTER), ("delayed messages", layout.DELAYED),
    ("segments", layout.SEGMENTS), ("messages", layout.MESSAGES),
    ("delayed messages", layout.DELAYED), ("messages", layout.MESSAGES),
    ("dead letters", layout.DEAD_LETTER),
)


def _check_empty(ctx: Context, topic: str) -> None:
    """Raise TopicNotEmptyError naming what ``topic`` still holds: its live leases
    first (a message leaves ``messages/`` or a segment, by a retry or nack, only
    while a consumer holds it: one held when the check starts is seen here, whatever
    it does next), then a LIST
    each in :data:`_CHECK_ORDER` (a message moved between sections meanwhile is seen
    in one of them). What stays open: a message claimed after the lease LISTs and
    moved three times or more before the last LIST (docs/operations.md)."""
    live: list[str] = []
    for name, prefix in (("live leases", layout.leases_prefix(topic)),
                         ("live segment leases", layout.segment_leases_prefix(topic))):
        listing = ctx.store.list(prefix)
        if any(not is_stale(o.last_modified, listing.server_time, ctx.visibility)
               for o in listing.objects):
            live.append(name)
    what: list[str] = []
    for name, section in _CHECK_ORDER:
        if name not in what and ctx.store.list(f"{topic}/{section}/", limit=1).objects:
            what.append(name)
    if what or live:
        raise TopicNotEmptyError(topic, ", ".join(what + live))
