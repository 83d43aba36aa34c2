"""``PawnQueue.stats`` and ``stats_all``: what a topic holds and who consumes it, counted
from listings, bounded, with the number of requests it took.

A topic is counted from one listing per prefix (``messages/``, ``leases/``,
``dead-letter/``, ``delayed/``; a packed topic's ``segments/`` and ``segment-leases/``)
and a GET per segment lease (a consumer holds a few at a time). No message, segment nor
delayed body is read: a segment's message count is in its key, a message's age in its
key's timestamp. Each listing stops at ``max_keys`` objects: the count is then of the
first ``max_keys`` keys only, and :attr:`TopicStats.exact` is False.

``pending`` and ``in_flight`` do not overlap (SQS's visible and not visible): a message
with a live lease, or an unsettled message of a segment under a live lease that is not
given back, is in flight; every other message under ``messages/`` or in a segment that
no lease recorded settled is pending. Leases are live by the server's clock, as the
janitor judges them. The listings are taken one after another, not at one instant: on
a busy topic a message acked or claimed in between counts in the state it was listed in.

Consumers come from the registry (one LIST of ``_registry/consumers/``, and a GET of an
entry this process has not read before, for its name): ``last_seen`` is the server's
LastModified of the entry, which a polling consumer rewrites once a
``registry.heartbeat_interval_seconds``; it is alive while that is within
``LIVENESS_HEARTBEATS`` intervals of the listing's server time (as :func:`.registry.rank`
judges). The registry does not record which topics a consumer reads (pawn-queue's JSON
shape), so every registered consumer is listed, and ``topics`` is None: the consumers
are the queue's, the same list for every topic. The registry is listed with a bound of
its own (``max_keys`` entries): :attr:`TopicStats.consumers_exact` says whether the
list is whole, and ``exact`` is about the topic's own listings only. :func:`consumers`
(``pq.consumers()``) reads the registry alone: the queue's consumers whether or not
it has a topic.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import attrs

from .. import layout
from ..errors import ObjectNotFound, SegmentError, TopicNotFoundError
from ..protocol.lease import is_stale
from ..protocol.segments import SegmentLease
from ..storage.base import Listing, ObjectInfo
from .context import Context
from .deadletters import check_limit
from .registry import LIVENESS_HEARTBEATS, RegistryEntry

__all__ = ["ConsumerStatus", "TopicStats", "consumers", "stats", "stats_all"]

#: Keys per ListObjectsV2 page (S3's maximum): what a listing costs in requests.
PAGE = 1000
#: The default bound of each listing: a topic deeper than this is counted approximately.
MAX_KEYS = 10_000
_CONSUMERS = f"{layout.REGISTRY_PREFIX}consumers/"


@attrs.frozen
class ConsumerStatus:
    """A registered consumer. ``last_seen``: when the server last saw its registry entry
    written (its heartbeat; None when the server did not say); ``alive``: that was
    within ``LIVENESS_HEARTBEATS`` heartbeat intervals of the server's time (a time not
    given counts as alive, as the registry rank counts it); ``name`` None for an entry
    that could not be read; ``topics`` None: the registry does not record them."""

    id: str
    name: str | None
    last_seen: datetime | None
    alive: bool
    topics: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601."""
        return {"id": self.id, "name": self.name, "last_seen": _iso(self.last_seen),
                "alive": self.alive,
                "topics": None if self.topics is None else list(self.topics)}


@attrs.frozen
class TopicStats:
    """What a topic holds (see the module docstring for what each count covers).

    ``pending``: messages waiting for a consumer (single messages and the unsettled
    messages of segments nobody holds); ``in_flight``: leased ones; ``dead_lettered``
    and ``delayed``: objects under ``dead-letter/`` and ``delayed/``;
    ``oldest_pending_age_seconds``: the server's time less the timestamp in the key of
    the oldest pending message (or segment), None when nothing is pending or the
    server gave no time; ``exact``: False when a listing stopped at ``max_keys`` (the
    counts then cover the first ``max_keys`` keys of a prefix: a lower bound, except
    that pending may hold leased messages whose lease was past the bound);
    ``requests``: the requests this call made for it; ``consumers``: the registered
    consumers of the QUEUE, not of this topic (the registry does not record which
    topics each reads: every topic of one call carries the same list);
    ``consumers_exact``: False when the registry listing stopped at ``max_keys`` (the
    first ``max_keys`` entries are listed)."""

    topic: str
    packed: bool
    pending: int
    in_flight: int
    dead_lettered: int
    delayed: int
    oldest_pending_age_seconds: float | None
    exact: bool
    server_time: datetime | None
    requests: int
    consumers: tuple[ConsumerStatus, ...] = ()
    consumers_exact: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601, consumers as dicts."""
        out = attrs.asdict(self, recurse=False)
        out["server_time"] = _iso(self.server_time)
        out["consumers"] = [c.to_dict() for c in self.consumers]
        return out


def _iso(when: datetime | None) -> str | None:
    return None if when is None else layout.iso(when)


# -- reading, counted ---------------------------------------------------------------------


@attrs.define
class _Reader:
    """The store calls of one count: bounded listings, GETs, and what they cost."""

    ctx: Context
    max_keys: int | None
    requests: int = 0
    exact: bool = True
    server_time: datetime | None = None

    def list(self, prefix: str) -> list[ObjectInfo]:
        """The objects under ``prefix``, at most ``max_keys``, a page of 1,000 (one
        request) at a time."""
        objects: list[ObjectInfo] = []
        while True:
            want = PAGE if self.max_keys is None else min(PAGE, self.max_keys - len(objects))
            listing = self.ctx.store.list(
                prefix, limit=want, start_after=objects[-1].key if objects else None)
            self._count(listing)
            objects += listing.objects
            if not listing.truncated or not listing.objects:
                return objects
            if self.max_keys is not None and len(objects) >= self.max_keys:
                self.exact = False
                return objects

    def children(self, prefix: str) -> tuple[list[ObjectInfo], list[str]]:
        """The objects right under ``prefix`` and its common prefixes (delimiter
        ``/``), unbounded; a request per 1,000 of them."""
        listing = self.ctx.store.list(prefix, delimiter="/")
        self._count(listing, max(1, math.ceil(
            (len(listing.objects) + len(listing.prefixes)) / PAGE)))
        return listing.objects, listing.prefixes

    def _count(self, listing: Listing, requests: int = 1) -> None:
        self.requests += requests
        if listing.server_time is not None:
            self.server_time = listing.server_time

    def get(self, key: str) -> bytes:
        self.requests += 1
        return self.ctx.store.get(key).body


#: Consumer registry key -> name, per context: an entry's key is derived from its name
#: (or, written by pawn-queue, random and never reused), so a name read once stays true.
#: Only the keys of the last listing are kept (pawn-queue's random keys come and go: a
#: long-running dashboard or metrics process would keep every key it ever saw).
_NAMES: weakref.WeakKeyDictionary[Context, dict[str, str]] = weakref.WeakKeyDictionary()
_NAMES_LOCK = threading.Lock()


@attrs.frozen
class _Consumers:
    """The registry as one count read it: the consumers, and whether the listing was
    whole."""

    listed: tuple[ConsumerStatus, ...]
    exact: bool


def _consumers(ctx: Context, max_keys: int | None, cost: _Reader) -> _Consumers:
    """Every registered consumer (at most ``max_keys``), by name: a LIST per 1,000, and
    a GET per entry not read yet, counted in ``cost.requests``. A reader of its own: a
    registry cut at the bound says nothing of a topic's counts."""
    reader = _Reader(ctx, max_keys)
    objects = reader.list(_CONSUMERS)
    now = reader.server_time
    window = LIVENESS_HEARTBEATS * ctx.config.registry.heartbeat_interval_seconds
    with _NAMES_LOCK:
        names = _NAMES.get(ctx, {})
    kept: dict[str, str] = {}
    out: list[ConsumerStatus] = []
    for info in objects:
        name = names.get(info.key)
        if name is None:
            try:
                name = RegistryEntry.from_json(json.loads(reader.get(info.key))).name
            except ObjectNotFound:
                continue  # removed since the listing
            except (ValueError, KeyError, TypeError):
                name = None  # unreadable: listed by id
        if name is not None:
            kept[info.key] = name
        seen = info.last_modified
        alive = now is None or seen is None or (now - seen).total_seconds() <= window
        entity = info.key[len(_CONSUMERS):].removesuffix(".json")
        out.append(ConsumerStatus(id=entity, name=name, last_seen=seen, alive=alive))
    with _NAMES_LOCK:
        _NAMES[ctx] = kept
    cost.requests += reader.requests
    return _Consumers(tuple(sorted(out, key=lambda c: (c.name or "", c.id))), reader.exact)


# -- one topic ------------------------------------------------------------------------------


@attrs.define
class _Tally:
    pending: int = 0
    in_flight: int = 0
    oldest: datetime | None = None

    def waiting(self, n: int, key: str) -> None:
        """``n`` pending messages in the object at ``key`` (its timestamp: their age)."""
        self.pending += n
        when = _key_time(key)
        if n and when is not None and (self.oldest is None or when < self.oldest):
            self.oldest = when


def _key_time(key: str) -> datetime | None:
    """The ``YYYYMMDDTHHMMSS_ffffff`` a message or segment key starts its name with."""
    try:
        return datetime.strptime(key.rsplit("/", 1)[-1][:22], "%Y%m%dT%H%M%S_%f").replace(
            tzinfo=timezone.utc)
    except ValueError:
        return None


def _topic(reader: _Reader, topic: str, consumers: _Consumers) -> TopicStats:
    """Count ``topic`` (TopicNotFoundError when its marker is not there)."""
    ctx = reader.ctx
    # One LIST of the topic's dot-objects: its marker and, packed, its manifest.
    markers = {o.key for o in reader.children(f"{topic}/.")[0]}
    if layout.topic_marker_key(topic) not in markers:
        raise TopicNotFoundError(topic)
    packed = layout.packed_manifest_key(topic) in markers
    if packed:
        ctx.remember_packed(topic)
    tally = _Tally()
    _singles(reader, topic, tally)
    if packed:
        _segments(reader, topic, tally)
    dead = len(reader.list(layout.dead_letter_prefix(topic)))
    delayed = len(reader.list(layout.delayed_prefix(topic)))
    now = reader.server_time
    age = None
    if tally.oldest is not None and now is not None:
        age = max(0.0, (now - tally.oldest).total_seconds())
    return TopicStats(
        topic=topic, packed=packed, pending=tally.pending, in_flight=tally.in_flight,
        dead_lettered=dead, delayed=delayed, oldest_pending_age_seconds=age,
        exact=reader.exact, server_time=now, requests=reader.requests,
        consumers=consumers.listed, consumers_exact=consumers.exact,
    )


def _singles(reader: _Reader, topic: str, tally: _Tally) -> None:
    """Single messages: in flight under a live lease, else pending. A live lease whose
    message is not listed (its ack under way) counts only when the listing stopped at
    the bound (its message may lie beyond)."""
    leases = reader.list(layout.leases_prefix(topic))
    now = reader.server_time
    live = {mid for o in leases if (mid := layout.lease_message_id(topic, o.key)) is not None
            and not is_stale(o.last_modified, now, reader.ctx.visibility)}
    before = reader.exact
    messages = reader.list(layout.messages_prefix(topic))
    listed: set[str] = set()
    for info in messages:
        mid = layout.parse_message_key(topic, info.key)
        if mid is not None and mid in live:
            listed.add(mid)
            tally.in_flight += 1
        else:
            tally.waiting(1, info.key)  # a foreign object too: a consumer quarantines it
    if before and not reader.exact:  # the message listing stopped at the bound
        tally.in_flight += len(live - listed)


def _segments(reader: _Reader, topic: str, tally: _Tally) -> None:
    """A packed topic's segments: each one's messages (from its key) less those its
    lease recorded settled; in flight while the lease is live and not given back."""
    counts: dict[str, tuple[int, str]] = {}
    for info in reader.list(layout.segments_prefix(topic)):
        parsed = layout.parse_segment_key(topic, info.key)
        if parsed is not None:
            counts[parsed[0]] = (parsed[1], info.key)
    settled, held = _leases(reader, topic, counts)
    for sid, (count, key) in counts.items():
        left = count - settled.get(sid, 0)
        if sid in held:
            tally.in_flight += left
        else:
            tally.waiting(left, key)


def _leases(reader: _Reader, topic: str, counts: dict[str, tuple[int, str]]
            ) -> tuple[dict[str, int], set[str]]:
    """(segment id -> messages its lease recorded settled, ids of segments held): a GET
    per lease of a listed segment. A lease removed since the listing settles nothing
    and holds nothing; an unreadable one settles nothing and holds while it is live."""
    infos: Iterable[ObjectInfo] = reader.list(layout.segment_leases_prefix(topic))
    now = reader.server_time
    settled: dict[str, int] = {}
    held: set[str] = set()
    for info in infos:
        sid = layout.segment_lease_id(topic, info.key)
        if sid is None or sid not in counts:
            continue  # foreign, or its segment is gone (finished) or past the bound
        live = not is_stale(info.last_modified, now, reader.ctx.visibility)
        try:
            lease = SegmentLease.decode(reader.get(info.key))
        except ObjectNotFound:
            continue
        except SegmentError:
            if live:
                held.add(sid)
            continue
        settled[sid] = lease.progress.settled_count(counts[sid][0])
        if live and not lease.released:
            held.add(sid)
    return settled, held


# -- the API ----------------------------------------------------------------------------------


def stats(ctx: Context, topic: str, max_keys: int | None = MAX_KEYS) -> TopicStats:
    """``topic``'s counts and the registered consumers. Cost: one LIST of the topic's
    marker and manifest, a LIST per 1,000 keys (at most ``max_keys``) of ``leases/``,
    ``messages/``, ``dead-letter/``, ``delayed/``, and on a packed topic of
    ``segments/`` and ``segment-leases/`` plus a GET per segment lease; a LIST per
    1,000 entries (at most ``max_keys``) of the consumer registry and a GET per entry
    this process has not read before."""
    check_limit("max_keys", max_keys)
    layout.validate_topic(topic)
    reader = _Reader(ctx, max_keys)
    return _topic(reader, topic, _consumers(ctx, max_keys, reader))


def consumers(ctx: Context, max_keys: int | None = MAX_KEYS
              ) -> tuple[list[ConsumerStatus], bool]:
    """The registered consumers of the queue, by name, alive or not, and whether the
    list is whole (False: the registry listing stopped at ``max_keys`` entries, the
    list is its first ones). With no topic as with many. Cost: a LIST per 1,000
    entries, and a GET per entry this process has not read before."""
    check_limit("max_keys", max_keys)
    read = _consumers(ctx, max_keys, _Reader(ctx, max_keys))
    return list(read.listed), read.exact


def stats_all(ctx: Context, max_keys: int | None = MAX_KEYS) -> list[TopicStats]:
    """:func:`stats` of every topic, by name; the registry is read once and the
    bucket's top level listed once (a LIST per 1,000 prefixes), those requests counted
    in the first topic's ``requests``. A prefix that is not a topic costs one LIST,
    counted in the next topic's (the last topic's, after it)."""
    check_limit("max_keys", max_keys)
    reader = _Reader(ctx, max_keys)
    _, prefixes = reader.children("")
    consumers = _consumers(ctx, max_keys, reader)
    out: list[TopicStats] = []
    for prefix in sorted(prefixes):
        name = prefix.rstrip("/")
        try:
            layout.validate_topic(name)
        except ValueError:
            continue  # the registry, probes, a foreign prefix
        try:
            out.append(_topic(reader, name, consumers))
        except TopicNotFoundError:
            continue  # no marker: not a topic (its LIST counts in the next one's)
        reader = _Reader(ctx, max_keys)
    if out and reader.requests:  # prefixes after the last topic: counted in its
        out[-1] = attrs.evolve(out[-1], requests=out[-1].requests + reader.requests)
    return out
