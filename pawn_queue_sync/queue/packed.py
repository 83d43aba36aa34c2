"""Packed topics: many messages per segment object, one lease per segment, progress
per message inside the lease (docs/guarantees.md, Packed topics). The second
:class:`~pawn_queue_sync.queue.source.MessageSource`, beside
:class:`~pawn_queue_sync.queue.objects.ObjectSource`, which still serves the topic's
single messages (written before it was packed, or by pawn-queue producers).

A poll hands out messages of the segments we hold first (:mod:`.held`: each delivery
recorded before it is returned), claims more segments when those have nothing left to
hand out (:mod:`.segment_claims`), then polls the topic's single messages for what is
still wanted (at most once a poll interval while none are found). Settlements are
recorded in the segment's lease, group-committed: an ack batch costs one lease write
per segment; a segment whose messages are all settled is deleted, then its lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from .. import layout
from ..errors import LeaseLostError, PawnQueueError, StorageError
from ..protocol import lease as leases
from ..protocol import segments
from ..protocol.effects import run
from ..storage.base import Listing
from . import delayed
from .claimant import Claimant
from .context import Context
from .held import HeldSegment
from .message import Message
from .objects import ObjectSource
from .segment_claims import PackedState, claim_segments, reap_gone

log = logging.getLogger(__name__)

#: Time an ack batch keeps in hand before a lease's fence to delete its segment
#: without recording the acks first (closer to the fence: it records them).
_FINISH_ROOM_SECONDS = 1.0


class PackedSource:
    """Claims and settles the messages of packed topics for one consumer."""

    def __init__(
        self, claimant: Claimant, peers: Callable[[], tuple[int, int]], objects: ObjectSource
    ) -> None:
        self._claimant = claimant
        self._peers = peers
        self._objects = objects
        self._states: dict[str, PackedState] = {}

    def state(self, topic: str) -> PackedState:
        state = self._states.get(topic)
        if state is None:
            state = self._states.setdefault(topic, PackedState())
        return state

    # -- polling ----------------------------------------------------------------------------

    def poll(self, topic: str, want: int, listed: Listing | None = None) -> list[Message]:
        """Up to ``want`` messages of ``topic``: from segments first, then single ones
        (``listed``: as an idle poll's listing just showed them, see ObjectSource)."""
        state = self.state(topic)
        with state.lock:
            got = self._from_segments(topic, state, want)
        rest = want - len(got)
        ctx = self._claimant.ctx
        now = ctx.clock.monotonic()
        due = state.singles_found or now - state.singles_at >= ctx.config.polling.interval_seconds
        if rest > 0 and (due or not got):
            try:
                singles = self._objects.poll(topic, rest, listed)
            except StorageError as exc:
                if not got:
                    raise
                log.warning("poll of single messages of %r failed: %s", topic, exc)
                singles = []
            state.singles_at, state.singles_found = now, bool(singles)
            got.extend(singles)
        return got

    def idle(self, topic: str) -> bool:
        """Our last polls of ``topic`` found no segment and no single message, and we
        hold no segment there."""
        state = self.state(topic)
        return (state.idle and self._objects.idle(topic)
                and all(s.done or s.lost for s in state.held))

    def singles_arrived(self, topic: str) -> None:
        """Single messages were just added to ``topic`` (due delayed ones moved to
        ``messages/``): the next poll that segments do not fill looks for them at
        once, rather than a poll interval after its last look."""
        self.state(topic).singles_found = True

    def _from_segments(self, topic: str, state: PackedState, want: int) -> list[Message]:
        got: list[Message] = []
        errors: list[StorageError] = []
        state.held = [s for s in state.held if not (s.done or s.lost)]
        for seg in list(state.held):
            if len(got) >= want:
                return got
            try:
                got.extend(seg.hand_out(want - len(got)))
            except LeaseLostError:
                continue
            except StorageError as exc:
                errors.append(exc)
        state.held = [s for s in state.held if not (s.done or s.lost)]
        busy = sum(1 for s in state.held if s.pending or s.reserved)
        slots = self._claimant.ctx.config.polling.max_segments_held - busy
        if len(got) < want and slots > 0:
            try:
                new = claim_segments(self._claimant, state, topic, slots, want - len(got),
                                     self._peers)
            except StorageError as exc:
                errors.append(exc)
                new = []
            state.held.extend(new)
            for seg in new:
                if len(got) < want:
                    try:
                        got.extend(seg.hand_out(want - len(got)))
                    except (StorageError, LeaseLostError) as exc:
                        log.warning("hand-out of segment %s failed: %s", seg.key, exc)
        if errors and not got:
            raise errors[0]
        return got

    def janitor(self, topic: str) -> int:
        """Remove stale leases of gone segments (and of single messages) now; how many
        leases are live afterwards."""
        ctx = self._claimant.ctx
        listing = ctx.store.list(layout.segment_leases_prefix(topic))
        now = listing.server_time or ctx.store.server_time()
        segs = ctx.store.list(layout.segments_prefix(topic))
        present = {parsed[0] for info in segs.objects
                   if (parsed := layout.parse_segment_key(topic, info.key))}
        live = 0
        for info in listing.objects:
            sid = layout.segment_lease_id(topic, info.key)
            stale = leases.is_stale(info.last_modified, now, ctx.visibility)
            if sid is not None and sid not in present and stale and not segs.truncated:
                reap_gone(self._claimant, info)
            else:
                live += 1
        return live + self._objects.janitor(topic)

    def give_back(self) -> None:
        """Give back every held segment with no message out (``released``, progress
        kept): another consumer may take it at once."""
        for state in list(self._states.values()):
            with state.lock:
                for seg in state.held:
                    if seg.give_back() and not seg.lost:
                        state.released[seg.lease_key] = seg.token
                state.held = [s for s in state.held if not (s.done or s.lost)]

    # -- settling ---------------------------------------------------------------------------

    def ack_many(self, msgs: Sequence[Message]) -> None:
        """One lease write per segment (concurrent callers share it); see
        :meth:`Consumer.ack_many <pawn_queue_sync.queue.consumer.Consumer.ack_many>`."""
        claimant = self._claimant
        todo, lost, others = Message.begin_acks(msgs)
        groups: dict[int, tuple[HeldSegment, list[Message], int]] = {}
        for msg in todo:
            seg = _segment(msg)
            groups.setdefault(id(seg), (seg, [], 0))[1].append(msg)
        try:
            for key, (seg, group, _) in list(groups.items()):
                indexes = [m.index for m in group]
                groups[key] = (seg, group, seg.change(lambda p, i=indexes: p.settle(i)))
            for seg in _finish_completed(claimant, [g[0] for g in groups.values()]):
                _acked(claimant, seg, groups.pop(id(seg))[1])
            outcomes = claimant.in_parallel(lambda g: _ack_segment(claimant, *g),
                                            list(groups.values()))
        finally:
            for msg in todo:
                msg.end_ack()
        errors = [e for e in outcomes if isinstance(e, StorageError)]
        lost.extend(m for m in todo if m.state == "lost")
        for msg in others:
            msg.wait_for_ack()
        retry = [m for m in others if m.state == "leased"]
        try:
            if retry:
                self.ack_many(retry)
        except (StorageError, LeaseLostError) as exc:
            if isinstance(exc, StorageError):
                errors.append(exc)
        unacked = [m for m in todo if m.state == "leased"]
        if unacked:
            raise StorageError(f"{len(unacked)} message(s) not acked, still leased: "
                               f"{errors[0] if errors else 'the store failed'}",
                               key=unacked[0].key) from (errors[0] if errors else None)
        if errors:
            raise errors[0]
        if lost:
            raise LeaseLostError(lost[0].id, f"{len(lost)} message(s) not acked")

    def nack(self, msg: Message, reason: str | None) -> None:
        seg = _segment(msg)
        with msg.exclusive_unsettled():
            if msg.state in ("acked", "nacked"):
                return
            if msg.state != "leased":
                raise LeaseLostError(msg.id, f"message was {msg.state}")
            if not seg.fresh():
                seg.renew()  # still ours before the dead letter is written
            doc = seg.dead_letter_doc(msg.index, reason or "nacked", msg.delivery_count)
            self._claimant.ctx.store.put(layout.dead_letter_key(msg.topic, msg.id), doc)
            seg.commit(seg.change(lambda p: p.settle([msg.index])))
            seg.settled_out(msg.index)
            self._claimant.settled(msg, "nacked")
        seg.finish_if_complete()

    def retry(self, msg: Message, error: str | None, delay: float | None = None) -> None:
        if delay is not None:
            self._retry_later(msg, error, delay)
            return
        seg = _segment(msg)
        with msg.exclusive():
            if msg.state != "leased" or msg.settling:
                return
            i = msg.index
            seg.commit(seg.change(lambda p: p.with_error(i, error) if error else p))
            self._claimant.settled(msg, "released")
            seg.back(i)

    def _retry_later(self, msg: Message, error: str | None, delay: float) -> None:
        """A retry with a delay: the message written as a delayed single message
        first (``attempts`` its deliveries so far; within the segment lease's fence),
        then settled in its segment as a nack settles it: a crash in between repeats
        it, never loses it. The lease found lost by that settlement removes the copy
        again (the message is delivered from its segment: the copy would be a third
        delivery) only when the lease on the server certainly does not record it
        settled: a LeaseLostError does not prove our write missed (a lost answer, or
        another thread's write that carried our settlement), and the copy is then the
        only one left (:func:`_settlement_missing`)."""
        seg = _segment(msg)
        with msg.exclusive():
            if msg.state != "leased" or msg.settling:
                return
            if not seg.fresh():
                seg.renew()  # still ours before the delayed copy is written
            doc = delayed.retry_doc({**msg.body, "topic": msg.topic}, msg.delivery_count,
                                    error)
            ctx = self._claimant.ctx
            written = delayed.write_retry(ctx, msg.topic, msg.id, doc, delay,
                                          deadline=seg.fence_ends())
            try:
                seg.commit(seg.change(lambda p: p.settle([msg.index])))
            except LeaseLostError:
                if _settlement_missing(ctx, seg, msg.index):  # the next holder delivers it
                    delayed.discard_retry(ctx, msg.topic, *written)
                raise
            seg.settled_out(msg.index)
            self._claimant.settled(msg, "released")
        seg.finish_if_complete()

    def release(self, msg: Message) -> None:
        seg = _segment(msg)
        with msg.exclusive():
            if msg.state != "leased" or msg.settling:
                return
            i = msg.index
            version = seg.change(lambda p: p.release([i]))
            self._claimant.settled(msg, "released")
            seg.back(i)
        try:
            seg.commit(version)
        except (StorageError, LeaseLostError) as exc:  # carried by the next write
            log.warning("release of %s/%s not recorded yet: %s", msg.topic, msg.id, exc)

    def refresh(self, msg: Message) -> None:
        """Rewrite the segment's lease if it is older than half the refresh interval
        (one write serves every message of the segment)."""
        seg = _segment(msg)
        with msg.exclusive():
            if msg.settling or msg.state in ("acked", "nacked"):
                return
            if msg.state != "leased":
                raise LeaseLostError(msg.id, f"message was {msg.state}")
            half = self._claimant.ctx.config.polling.lease_refresh_interval_seconds / 2
            if seg.age() >= half:
                seg.renew()
            msg.lease_token, msg.lease_written_at = seg.token, seg.written_at


def _settlement_missing(ctx: Context, seg: HeldSegment, index: int) -> bool:
    """Whether the segment's lease, as the server holds it now, certainly does not
    record message ``index`` settled: read, of this segment, progress not settling it.
    A lease gone (the segment finished, or reaped), unreadable, or a failed GET is
    unknown: False, so the caller keeps its copy (a repeat at worst, never a loss)."""
    try:
        found = run(segments.load(seg.lease_key), ctx.store, ctx.clock)
    except PawnQueueError as exc:
        log.warning("could not read the lease of segment %s after losing it: %s",
                    seg.segment_id, exc)
        return False
    if found is None or found[0].segment_key != seg.key:
        return False
    return not found[0].progress.is_settled(index)


def _segment(msg: Message) -> HeldSegment:
    if msg.segment is None:
        raise TypeError("not a message of a segment")
    return msg.segment


def _ack_segment(
    claimant: Claimant, seg: HeldSegment, msgs: list[Message], version: int
) -> StorageError | None:
    """Record the acks of ``msgs`` (one segment's, change ``version``) in one write,
    shared with concurrent callers; finish the segment if it is complete."""
    try:
        seg.commit(version)
    except LeaseLostError:
        return None  # its messages out are lost now
    except StorageError as exc:
        return exc
    _acked(claimant, seg, msgs)
    seg.finish_if_complete()
    return None


def _acked(claimant: Claimant, seg: HeldSegment, msgs: list[Message]) -> None:
    for msg in msgs:
        seg.settled_out(msg.index)
        claimant.settled(msg, "acked")


def _finish_completed(claimant: Claimant, segs: list[HeldSegment]) -> list[HeldSegment]:
    """Segments an ack batch completes, deleted without writing their leases first:
    the segments in one request (DeleteObjects), sent within the time fence of every
    lease (while they are certainly ours, as a plain ack's deletes), then their leases
    (unconditionally: with the segment gone a lease protects nothing). Deleting a
    segment settles all its messages for good, so it stands for the record. The
    segments finished; the others are left to record their acks."""
    ctx = claimant.ctx
    candidates = [s for s in segs if s.desired.complete]
    if not candidates:
        return []
    candidates.sort(key=id)  # one lock order for every batch
    for seg in candidates:
        seg.write_lock.acquire()
    try:
        ready = [s for s in candidates if not (s.done or s.lost) and s.desired.complete
                 and s.fenced_for(_FINISH_ROOM_SECONDS)]
        if not ready:
            return []
        deadline = min(s.fence_ends() for s in ready)
        try:
            failed = set(ctx.store.delete_many([s.key for s in ready], deadline=deadline))
        except StorageError as exc:  # they record their acks instead
            log.info("could not delete %d completed segment(s) at once: %s", len(ready), exc)
            return []
        gone = [s for s in ready if s.key not in failed]
        for seg in gone:
            seg.done = True
        try:
            failed = set(ctx.store.delete_many([s.lease_key for s in gone]))
        except StorageError as exc:
            failed = {s.lease_key for s in gone}
            log.warning("finished, but could not delete %d segment lease(s): %s", len(gone),
                        exc)
        if failed:  # stale leases of gone segments: removed by a later poll
            log.warning("could not delete %d lease(s) of finished segments", len(failed))
        return gone
    finally:
        for seg in candidates:
            seg.write_lock.release()


__all__ = ["PackedSource"]
