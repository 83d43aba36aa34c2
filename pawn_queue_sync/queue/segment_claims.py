"""Finding and claiming segments of a packed topic: a LIST of the segment leases and
one of the segments (oldest first), a choice among the free ones (at random among the
oldest when others consume the topic too), then per segment a claim (a new lease
whose first version counts the first hand-out) or a takeover of a stale or released
lease (its progress carried over), then one GET of the segment. A corrupt or foreign
segment is moved to the dead-letter prefix and never breaks a poll; a stale lease
whose segment is gone is removed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import attrs

from .. import layout, packing
from ..errors import ObjectNotFound, SegmentError, StorageError
from ..protocol import lease as leases
from ..protocol import segments
from ..protocol.effects import run
from ..protocol.segments import Progress, SegmentLease
from ..storage.base import Listing, ObjectInfo
from . import claims, planning
from .claimant import Claimant
from .held import HeldSegment, renew_locks_after_fork, reservation

log = logging.getLogger(__name__)

#: Leases held by others a poll with nothing to claim reads at most, to find ones
#: given back (``released``), which a listing cannot tell from live ones.
_PROBES_PER_POLL = 2
#: Stale leases of gone segments one poll removes at most.
_REAP_PER_POLL = 50
#: How long a consumer alone on a topic (no rival met, no other registered) goes on
#: judging segments by its last listing of their leases: its claims are conditional
#: writes, so a lease it did not see costs a lost claim, never a second holder.
_LEASES_REUSED_S = 1.0


@attrs.define(eq=False)
class PackedState:
    """What a consumer's polls of one packed topic remember for the next."""

    #: the segments we hold, oldest first
    held: list[HeldSegment] = attrs.field(factory=list)
    #: our last poll found no segment
    idle: bool = True
    #: our last claims met rivals (leases not ours, or lost claims)
    contended: bool = False
    #: lease key -> ETag of a version seen released (given back: free to take)
    released: dict[str, str] = attrs.field(factory=dict)
    #: lease key -> ETag of a version read and found held (not read again unchanged)
    busy: dict[str, str] = attrs.field(factory=dict)
    #: when (monotonic) the topic's single messages were last polled, and what it found
    singles_at: float = float("-inf")
    singles_found: bool = True
    #: our last listing of the segment leases, and when (monotonic)
    leases: Listing | None = None
    leases_at: float = float("-inf")
    #: deliveries our last claims reserved in all, and when (monotonic)
    reserve_size: int = 0
    reserved_at: float = float("-inf")
    #: polls of this topic run one at a time
    lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    def __attrs_post_init__(self) -> None:
        renew_locks_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock, and no segment held (they are the
        parent's: the child claims its own; see HeldSegment._after_fork)."""
        self.lock = threading.Lock()
        self.held = []


@attrs.frozen
class Candidate:
    """A segment a poll may take: its key, id, message count, and the lease on it
    (None: free) as the listing showed it."""

    key: str
    sid: str
    count: int
    lease: ObjectInfo | None = None


def claim_segments(
    claimant: Claimant, state: PackedState, topic: str, slots: int, want: int,
    peers: Callable[[], tuple[int, int]],
) -> list[HeldSegment]:
    """Claim up to ``slots`` segments of ``topic``, enough for ``want`` messages, each
    with its first hand-out recorded: the claims of one poll reserve ``want``
    deliveries in all, doubling while claims follow within a second (as a held
    segment's reservations, up to RESERVE_MAX), so a busy listener takes several small
    segments per listing and hands their messages out without a write of its own.
    Raises the first store error when every claim tried failed on one (rather than
    look like an empty topic)."""
    alone = not state.contended and peers()[1] <= 1
    found = _candidates(claimant, state, topic, slots, want, alone)
    if not found:
        return []
    now = claimant.ctx.clock.monotonic()
    target = reservation(max(1, want), state.reserve_size, now - state.reserved_at)
    state.reserve_size, state.reserved_at = target, now
    chosen = _choose(claimant, state, found, slots, want, target, peers)
    sizes, left = [], target
    for candidate in chosen:  # the reservation spread over them, oldest first
        sizes.append(max(1, min(candidate.count, left)))
        left -= sizes[-1]
    outcomes = claimant.in_parallel(lambda c: _claim_safely(claimant, topic, *c),
                                    list(zip(chosen, sizes, strict=True)))
    errors = [o for o in outcomes if isinstance(o, StorageError)]
    got = [o for o in outcomes if isinstance(o, HeldSegment)]
    state.contended = state.contended or len(got) < len(chosen)
    if errors and not got:
        raise errors[0]
    return sorted(got, key=lambda s: s.key)


def _candidates(
    claimant: Claimant, state: PackedState, topic: str, slots: int, want: int, alone: bool
) -> list[Candidate]:
    """The segments a poll may take, oldest first: free ones, ones whose lease is
    stale by the server's clock, ones seen given back. Listings: the leases first
    when busy (so a segment missing from the later segment listing is gone for good:
    its stale lease is removed); an idle poll lists segments first (an empty topic
    costs one request). A consumer ``alone`` on the topic reuses its last listing of
    the leases for up to _LEASES_REUSED_S (no reaping from it)."""
    ctx = claimant.ctx
    store = ctx.store
    ours = {s.segment_id for s in state.held}
    width = planning.window(max(slots, want), len(state.held), state.contended)
    limit = planning.listing_limit(width, len(state.held) + len(state.busy))
    now_mono = ctx.clock.monotonic()
    reused = (state.leases if alone and now_mono - state.leases_at < _LEASES_REUSED_S
              else None)
    if state.idle or reused is not None:
        listing = store.list(layout.segments_prefix(topic), limit=limit)
        if not listing.objects:
            state.idle = True
            return []
        lease_listing = reused or store.list(layout.segment_leases_prefix(topic))
        reap_ok = False
    else:
        lease_listing = store.list(layout.segment_leases_prefix(topic))
        listing = store.list(layout.segments_prefix(topic), limit=limit)
        reap_ok = not listing.truncated
    if reused is None:
        state.leases, state.leases_at = lease_listing, now_mono
    state.idle = not listing.objects
    now = lease_listing.server_time or store.server_time()
    on: dict[str, ObjectInfo] = {}
    for info in lease_listing.objects:
        sid = layout.segment_lease_id(topic, info.key)
        if sid is not None:
            on[sid] = info
    free: list[Candidate] = []
    held: list[Candidate] = []
    listed: set[str] = set()
    for info in listing.objects:
        parsed = layout.parse_segment_key(topic, info.key)
        if parsed is None:
            claims.quarantine_foreign(claimant, topic, info.key, info.size)
            continue
        sid, count = parsed
        listed.add(sid)
        if sid in ours:
            continue
        lease = on.get(sid)
        candidate = Candidate(info.key, sid, count, lease)
        if (lease is None or state.released.get(lease.key) == lease.etag
                or leases.is_stale(lease.last_modified, now, ctx.visibility)):
            free.append(candidate)
        else:
            held.append(candidate)
    state.contended = bool(held)  # lost claims add to it (claim_segments)
    if reap_ok:
        gone = [i for sid, i in on.items() if sid not in listed and sid not in ours
                and leases.is_stale(i.last_modified, now, ctx.visibility)]
        for info in gone[:_REAP_PER_POLL]:
            reap_gone(claimant, info)
    if not free and held:
        free = _given_back(claimant, state, held)
    return free


def reap_gone(claimant: Claimant, info: ObjectInfo) -> None:
    """Remove a stale lease whose segment is gone (finished by a holder that died
    before deleting its lease), only if it is still the version judged stale."""
    ctx = claimant.ctx
    try:
        if run(leases.reap(info.key, info.etag, ctx.caps, ctx.csprng), ctx.store, ctx.clock):
            log.info("removed stale lease %s (its segment is gone)", info.key)
            topic = info.key.rpartition(f"/{layout.SEGMENT_LEASES}/")[0]
            claimant.emit("reaped", topic, layout.segment_lease_id(topic, info.key))
    except StorageError as exc:
        log.warning("could not remove stale lease %s: %s", info.key, exc)


def _given_back(
    claimant: Claimant, state: PackedState, held: list[Candidate]
) -> list[Candidate]:
    """Read a few leases held by others (not read unchanged before) to find ones given
    back: those may be taken at once."""
    found: list[Candidate] = []
    if len(state.busy) > 10_000:
        state.busy.clear()
    probes = [c for c in held if c.lease and state.busy.get(c.lease.key) != c.lease.etag]
    for candidate in probes[:_PROBES_PER_POLL]:
        assert candidate.lease is not None
        key, etag = candidate.lease.key, candidate.lease.etag
        try:
            got = claimant.ctx.store.get(key)
            released = SegmentLease.decode(got.body).released
        except (ObjectNotFound, SegmentError):
            continue
        except StorageError as exc:
            log.warning("could not read segment lease %s: %s", key, exc)
            continue
        if got.etag != etag:
            continue
        if released:
            state.released[key] = etag
            found.append(candidate)
        else:
            state.busy[key] = etag
    return found


def _choose(
    claimant: Claimant, state: PackedState, found: list[Candidate], slots: int, want: int,
    target: int, peers: Callable[[], tuple[int, int]],
) -> list[Candidate]:
    """The segments to claim: as few as hold ``target`` (>= ``want``) messages, the
    oldest, with at most ``slots`` of them left with messages to hand out after this
    poll's ``want`` (a segment the poll hands out whole takes no slot: small segments
    are claimed as many at a time as single messages are); with rivals about (or other
    consumers registered) at random among the oldest CONTENDED_WINDOW times as many, so
    consumers polling together rarely race for one segment."""
    k, total, busy = 0, 0, 0
    for candidate in found:
        if busy >= slots or total >= target:
            break
        k += 1
        busy += total + candidate.count > want
        total += candidate.count
    spread = state.contended or peers()[1] > 1
    if not spread or len(found) <= k:
        return found[:k]
    window = found[: k * planning.CONTENDED_WINDOW]
    return sorted(claimant.rng.sample(window, k), key=lambda c: c.key)


def _claim_safely(
    claimant: Claimant, topic: str, candidate: Candidate, size: int
) -> HeldSegment | StorageError | None:
    try:
        return _claim(claimant, topic, candidate, size)
    except StorageError as exc:
        log.warning("claim of segment %s failed: %s", candidate.key, exc)
        return exc


def _claim(
    claimant: Claimant, topic: str, candidate: Candidate, size: int
) -> HeldSegment | None:
    """Claim or take over one segment, recording the first hand-out of up to ``size``
    messages, then read it. None when another consumer got it first, or it is gone,
    done with, or unusable (moved aside)."""
    ctx = claimant.ctx
    most = ctx.config.polling.max_delivery_count
    lease_key = layout.segment_lease_key(topic, candidate.sid)
    abandoned = False
    if candidate.lease is None:
        progress, handed, exhausted = Progress(count=candidate.count).hand_out(
            range(min(size, candidate.count)), most)
        lease = SegmentLease.new(claimant.id, candidate.sid, candidate.key, ctx.clock.now(),
                                 ctx.visibility, progress)
        started = ctx.clock.monotonic()
        token = run(segments.claim_segment(ctx.caps, lease_key, lease, ctx.csprng, claimant.rng),
                    ctx.store, ctx.clock)
    else:
        try:
            got = ctx.store.get(lease_key)
        except ObjectNotFound:
            return None  # finished meanwhile: a later poll sees what is left
        if got.etag != candidate.lease.etag:
            return None  # renewed, or taken by someone else, since the listing
        old = _decoded(got.body, claimant, candidate, lease_key)
        abandoned = not old.released  # stale: its holder died or stalled
        progress = old.progress
        if progress.count != candidate.count:  # the key's count, checked on reading:
            progress = progress.with_count(candidate.count)  # never trust the lease's
        progress, handed, exhausted = progress.hand_out(progress.unsettled(limit=size), most)
        lease = old.rewritten(ctx.clock.now(), ctx.visibility, progress,
                              consumer_id=claimant.id)
        started = ctx.clock.monotonic()
        token = run(segments.take_over(ctx.caps, lease_key, got.etag, lease, ctx.csprng),
                    ctx.store, ctx.clock)
    if token is None:
        return None
    if abandoned:  # a stale lease taken over: as a reap of a message's
        claimant.emit("reaped", topic, candidate.sid)
    seg = HeldSegment(claimant, topic, candidate.sid, candidate.key, lease_key, token, lease,
                      started)
    if progress.complete:  # its last holder died finishing it
        seg.finish_if_complete()
        return None
    if not _read(claimant, seg, candidate.count, handed):
        return None
    seg.start(handed, exhausted)
    if exhausted:
        try:
            seg.commit(seg.version)
        except StorageError as exc:  # recorded with the next write (then finished)
            log.warning("could not record dead letters of %s: %s", seg.key, exc)
            return seg
        if seg.finish_if_complete():  # those were its last unsettled messages
            return None
    return seg


def _decoded(
    raw: bytes, claimant: Claimant, candidate: Candidate, lease_key: str
) -> SegmentLease:
    """A stale lease's content; one that cannot be read is replaced as if new (its
    progress is lost: its settled messages are delivered again, never lost)."""
    try:
        return SegmentLease.decode(raw)
    except SegmentError as exc:
        log.warning("segment lease %s is unreadable (%s): taking it over afresh", lease_key,
                    exc)
        ctx = claimant.ctx
        return SegmentLease.new(claimant.id, candidate.sid, candidate.key, ctx.clock.now(),
                                ctx.visibility, Progress(count=candidate.count))


def _read(claimant: Claimant, seg: HeldSegment, count: int, handed: list[int]) -> bool:
    """GET and decode the segment we just leased. Gone: our lease is given back.
    Corrupt or not the segment its key names: moved to the dead-letter prefix, then
    our lease removed. A store error gives the segment back and is raised."""
    ctx = claimant.ctx
    try:
        got = ctx.store.get(seg.key)
    except ObjectNotFound:  # finished by its last holder since our listing
        seg.drop_lease()
        return False
    except StorageError:
        seg.change(lambda p: p.release(handed))
        seg.give_back()
        raise
    try:
        docs = packing.decode_segment(got.body, seg.topic, seg.segment_id)
        if len(docs) != count:
            raise SegmentError(f"its key says {count} message(s), it holds {len(docs)}")
    except SegmentError as exc:
        raw = got.body if len(got.body) <= 4 * ctx.config.publishing.max_payload_bytes else None
        try:
            claims.quarantine(claimant, seg.topic, seg.key, raw, f"corrupt segment: {exc}", None)
        except StorageError as error:  # our lease goes stale; a later claim tries again
            log.warning("could not move corrupt segment %s aside: %s", seg.key, error)
            seg.done = True
            return False
        seg.drop_lease()
        return False
    seg.docs = docs
    return True


__all__ = ["Candidate", "PackedState", "claim_segments", "reap_gone"]
