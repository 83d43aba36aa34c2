"""A segment a consumer holds: its lease, its messages, what is handed out, and the
group commit of its progress (docs/guarantees.md, Packed topics).

Every change (a hand-out counted, a settlement) is applied at once to ``desired``, the
progress to write, and gets a version number; :meth:`HeldSegment.commit` writes the
lease (:func:`~pawn_queue_sync.protocol.segments.record`) unless a write that carried
that version has completed already. One write at a time per segment: callers arriving
while one is in flight wait, and the first of them writes everything changed since,
so the others return without a request of their own (one write per flush, not one per
message).

A hand-out is recorded before it happens: deliveries are counted for a *reservation*
of up to :data:`RESERVE_MAX` messages at a time (growing while polls come quickly), and
messages of it are handed out without a write while the lease is younger than the
refresh interval (its last write proves it ours: nobody takes a lease over before it
is stale). A crash therefore counts a delivery also for the messages reserved and not
yet handed out, as a listener's prefetched messages are counted on plain topics.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs

from .. import layout
from ..errors import LeaseLostError, StorageError
from ..protocol import segments
from ..protocol.effects import run
from ..protocol.segments import Progress, SegmentLease
from .claimant import Claimant
from .message import Message

log = logging.getLogger(__name__)

#: Most deliveries one hand-out write counts ahead (what a crash may count unused).
RESERVE_MAX = 128
#: A reservation made within this many seconds of the last one is twice as large.
_RESERVE_GROWS_WITHIN_S = 1.0


@attrs.define(eq=False)
class HeldSegment:
    """One segment under our lease (see the module)."""

    claimant: Claimant = attrs.field(repr=False)
    topic: str
    segment_id: str
    key: str
    lease_key: str = attrs.field(repr=False)
    #: our lease version (its ETag) and its content, as last written
    token: str = attrs.field(repr=False)
    lease: SegmentLease = attrs.field(repr=False)
    #: monotonic time just before the request that wrote ``token``
    written_at: float = attrs.field(repr=False)
    #: the segment's messages (id, producer_id, created_at, payload), by index
    docs: list[dict[str, Any]] = attrs.field(factory=list, repr=False)
    #: the progress with every change applied, written or not
    desired: Progress = attrs.field(init=False, repr=False)
    version: int = attrs.field(default=0, init=False, repr=False)
    #: the highest version a completed write carried
    carried: int = attrs.field(default=0, init=False, repr=False)
    #: handed out and not settled, by index
    out: dict[int, Message] = attrs.field(factory=dict, init=False, repr=False)
    #: deliveries counted and recorded, not handed out yet (index order)
    reserved: deque[int] = attrs.field(factory=deque, init=False, repr=False)
    #: unsettled indexes with no delivery under way (a heap: lowest first)
    pending: list[int] = attrs.field(factory=list, init=False, repr=False)
    lost: bool = attrs.field(default=False, init=False)
    #: finished or given back: nothing more is handed out or written
    done: bool = attrs.field(default=False, init=False)
    _reserve_size: int = attrs.field(default=0, init=False, repr=False)
    _reserved_at: float = attrs.field(default=float("-inf"), init=False, repr=False)
    lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    write_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.desired = self.lease.progress
        renew_locks_after_fork(self)

    # -- changes and their group commit -----------------------------------------------------

    def change(self, fn: Callable[[Progress], Progress]) -> int:
        """Apply ``fn`` to the progress to write; the version that carries it."""
        with self.lock:
            self.desired = fn(self.desired)
            self.version += 1
            return self.version

    def commit(self, version: int) -> None:
        """Return once a lease write carrying ``version`` has completed: ours, or one
        under way when we arrived. Raises LeaseLostError when the lease is no longer
        ours (every message out is then ``lost``), StorageError when the write failed
        (the change stays pending: the next write carries it)."""
        with self.write_lock:
            if self.carried >= version or (self.done and not self.lost):
                return  # carried; or every message settled and the segment deleted
            if self.lost:
                raise LeaseLostError(self.segment_id, "the segment's lease was lost")
            self._write()

    def _write(self, released: bool = False) -> None:
        """Write everything changed so far (``write_lock`` held)."""
        ctx = self.claimant.ctx
        with self.lock:
            progress, upto = self.desired, self.version
        body = self.lease.rewritten(ctx.clock.now(), ctx.visibility, progress, released=released)
        started = ctx.clock.monotonic()
        try:
            token = run(segments.record(ctx.caps, self.lease_key, self.token, body, ctx.csprng),
                        ctx.store, ctx.clock)
        except LeaseLostError:
            self._lose()
            raise
        with self.lock:
            self.token, self.lease, self.written_at, self.carried = token, body, started, upto

    def _lose(self) -> None:
        """The lease was taken: every message out is lost, nothing more is handed out."""
        with self.lock:
            self.lost = True
            out = list(self.out.values())
            self.out.clear()
            self.reserved.clear()
            self.pending = []
        for msg in out:
            self.claimant.settled(msg, "lost")
        log.warning("lease on segment %s of %s lost (%d message(s) out)", self.segment_id,
                    self.topic, len(out))

    def age(self) -> float:
        """Seconds since our current lease version was written (local monotonic clock)."""
        return self.claimant.ctx.clock.monotonic() - self.written_at

    def fresh(self) -> bool:
        """Our last write is recent enough to hand out what it reserved: younger than
        the refresh interval and well inside the time fence (nobody takes a lease over
        before it is stale by the server's clock)."""
        ctx = self.claimant.ctx
        limit = min(ctx.config.polling.lease_refresh_interval_seconds,
                    ctx.visibility - ctx.fence_margin())
        return self.age() < limit

    def fence_ends(self) -> float:
        """When (monotonic) our lease stops being certainly ours without asking: the
        deadline of requests that act on it alone."""
        ctx = self.claimant.ctx
        return self.written_at + ctx.visibility - ctx.fence_margin()

    def fenced_for(self, room: float) -> bool:
        """Our lease is certainly ours for ``room`` seconds more (at most a quarter of
        the fence window)."""
        ctx = self.claimant.ctx
        window = ctx.visibility - ctx.fence_margin()
        return ctx.clock.monotonic() + min(room, window / 4) < self.fence_ends()

    def renew(self) -> None:
        """Rewrite the lease now (progress included)."""
        self.commit(self.change(_same))

    # -- handing out ---------------------------------------------------------------------

    def start(self, reserved: Iterable[int], exhausted: Iterable[int]) -> None:
        """Just claimed or taken over, its first hand-out ``reserved`` recorded: what
        is left unsettled waits in ``pending``; ``exhausted`` (delivered too often) are
        dead-lettered now."""
        reserved, exhausted = list(reserved), list(exhausted)
        skip = set(reserved) | set(exhausted)
        with self.lock:
            self.reserved.extend(reserved)
            self.pending = [i for i in self.desired.unsettled() if i not in skip]
            self._reserve_size = len(reserved)
            self._reserved_at = self.claimant.ctx.clock.monotonic()
        if exhausted:
            self.dead_letter_exhausted(exhausted)

    def hand_out(self, n: int) -> list[Message]:
        """Up to ``n`` messages, each delivery recorded before it is returned. Raises
        LeaseLostError or StorageError when the hand-out could not be recorded."""
        got = self._take(n)
        if len(got) >= n:
            return got
        with self.lock:
            idle = self.lost or self.done or not (self.pending or self.reserved)
            # every message settled, the last by dead letters whose record had failed
            unfinished = not (self.lost or self.done) and self.desired.complete
            if not idle:
                picks = [heapq.heappop(self.pending)
                         for _ in range(min(self._next_size(n), len(self.pending)))]
                self.desired, handed, exhausted = self.desired.hand_out(
                    picks, self.claimant.ctx.config.polling.max_delivery_count)
                self.version += 1
                version = self.version
        if idle:
            if unfinished:
                self._finish_settled(got)
            return got
        if exhausted:
            self.dead_letter_exhausted(exhausted)
        try:
            self.commit(version)  # also rewrites what was reserved if it had aged
        except StorageError:
            with self.lock:  # not recorded: not counted, and free to go again
                self.desired = self.desired.release(handed)
                self.version += 1
                for i in handed:
                    heapq.heappush(self.pending, i)
            if got:
                return got
            raise
        with self.lock:
            self.reserved.extend(handed)
        if exhausted:  # the last unsettled messages may have been dead-lettered
            self._finish_settled(got)
        return got + self._take(n - len(got))

    def _finish_settled(self, got: list[Message]) -> None:
        """Every message settled without an ack (dead-lettered at
        ``max_delivery_count``): record it if not yet, then finish the segment, as the
        ack or nack of the last message does. A failed write is raised unless ``got``
        has messages to return (a later poll tries again)."""
        try:
            self.commit(self.version)
        except (StorageError, LeaseLostError) as exc:
            if got or isinstance(exc, LeaseLostError):
                return
            raise
        self.finish_if_complete()

    def _take(self, n: int) -> list[Message]:
        """Up to ``n`` reserved messages, while our last write is fresh."""
        with self.lock:
            if self.lost or self.done or not self.reserved or not self.fresh():
                return []
            indexes = [self.reserved.popleft() for _ in range(min(n, len(self.reserved)))]
            msgs = [self._message(i) for i in indexes]
        for msg in msgs:
            self.claimant.track(msg)
        return msgs

    def _next_size(self, n: int) -> int:
        """How many deliveries to count ahead: ``n``, doubling (up to RESERVE_MAX) while
        reservations follow each other within a second."""
        now = self.claimant.ctx.clock.monotonic()
        size = reservation(n, self._reserve_size, now - self._reserved_at)
        self._reserve_size, self._reserved_at = size, now
        return size

    def _message(self, i: int) -> Message:
        """Message ``i`` handed out now (``lock`` held)."""
        doc = self.docs[i]
        msg = Message(
            id=doc["id"],
            topic=self.topic,
            producer_id=doc.get("producer_id"),
            created_at=str(doc.get("created_at", "")),
            payload=doc["payload"],
            key=self.key,
            lease_key=self.lease_key,
            lease_token=self.token,
            lease_written_at=self.written_at,
            delivery_count=self.desired.deliveries_of(i),
            body=doc,
            consumer=self.claimant.consumer,
            segment=self,
            index=i,
        )
        self.out[i] = msg
        return msg

    def back(self, i: int) -> None:
        """Message ``i`` is no longer out and not settled: it goes again."""
        with self.lock:
            if self.out.pop(i, None) is not None and not self.lost:
                heapq.heappush(self.pending, i)

    def settled_out(self, i: int) -> None:
        with self.lock:
            self.out.pop(i, None)

    # -- dead letters ---------------------------------------------------------------------

    def dead_letter_doc(self, i: int, reason: str, count: int) -> bytes:
        """The dead letter of message ``i``: the message as a plain topic stores it,
        with ``dead_letter`` (the reason, who, when, deliveries, the segment)."""
        ctx = self.claimant.ctx
        doc = dict(self.docs[i])
        doc["topic"] = self.topic
        doc["dead_letter"] = {
            "reason": reason,
            "consumer_id": self.claimant.id,
            "at": layout.iso(ctx.clock.now()),
            "delivery_count": count,
            "original_key": self.key,
            "segment_index": i,
        }
        return layout.canonical_json(doc)

    def dead_letter_exhausted(self, indexes: list[int]) -> None:
        """Dead-letter messages whose recorded deliveries reached
        ``polling.max_delivery_count`` unsettled, then count them settled (recorded by
        the next write). One whose dead letter cannot be written stays pending."""
        ctx = self.claimant.ctx
        most = ctx.config.polling.max_delivery_count

        def write(i: int) -> int | None:
            count = self.desired.deliveries_of(i)
            reason = (f"delivered {count} times without an ack (the handler's process "
                      f"may have died); polling.max_delivery_count is {most}")
            last = self.desired.error_of(i)
            if last:
                reason += f"; last error: {last}"
            try:
                ctx.store.put(layout.dead_letter_key(self.topic, self.docs[i]["id"]),
                              self.dead_letter_doc(i, reason, count))
            except StorageError as exc:
                log.warning("could not dead-letter %s/%s: %s", self.topic,
                            self.docs[i]["id"], exc)
                return None
            log.warning("dead-lettered %s/%s: %s", self.topic, self.docs[i]["id"], reason)
            self.claimant.emit("dead_lettered", self.topic, self.docs[i]["id"],
                               delivery_count=count, error=reason)
            return i

        # one after another: this may run on a claim pool thread (a claim's), which
        # must not wait for others of the same pool; the path is rare
        done = [i for i in map(write, indexes) if i is not None]
        failed = set(indexes).difference(done)
        self.change(lambda p: p.settle(done))
        with self.lock:
            for i in sorted(failed):
                heapq.heappush(self.pending, i)

    # -- the end --------------------------------------------------------------------------

    def finish_if_complete(self) -> bool:
        """Once the written progress has every message settled: delete the segment,
        then our lease. True when the segment is done with (finished now or before)."""
        with self.write_lock:
            if self.done:
                return True
            if self.lost or not self.lease.progress.complete:
                return False
            self.done = True
            ctx = self.claimant.ctx
            try:
                run(segments.finish(ctx.caps, self.lease_key, self.token, self.key, ctx.csprng),
                    ctx.store, ctx.clock)
            except StorageError as exc:  # the lease goes stale; a taker finishes it
                log.warning("could not finish segment %s: %s", self.key, exc)
            return True

    def give_back(self) -> bool:
        """Write our lease ``released`` (progress kept, the deliveries counted ahead
        taken back), so another consumer may take the segment at once. Only with no
        message out; True when given back (or already done with)."""
        with self.write_lock:
            if self.done or self.lost:
                return True
            with self.lock:
                if self.out:
                    return False
                back = list(self.reserved)
                self.reserved.clear()
                self.desired = self.desired.release(back)
                self.version += 1
                self.done = True
            try:
                self._write(released=True)
            except (StorageError, LeaseLostError) as exc:  # it goes stale instead
                log.warning("could not give back segment %s: %s", self.key, exc)
            return True

    def drop_lease(self) -> None:
        """Give back a lease whose segment is unusable (gone or quarantined): delete it
        while it is ours."""
        self.done = True
        self.claimant.drop_lease(self.lease_key, self.token)

    def _after_fork(self) -> None:
        """In a forked child: fresh locks, and the segment is not ours. Its lease and
        the deliveries it reserved are the parent's, which goes on handing them out
        and settling them: a child handing them out too would deliver them twice under
        one lease, and a child writing the lease with the parent's token would take it
        from the parent (whose other messages out would then be redelivered). So the
        child's copies of its messages out are ``lost`` (settling one raises
        LeaseLostError and writes nothing; the parent settles it, or it is delivered
        again once the parent's lease ends)."""
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.reserved.clear()
        self.pending = []
        self.lost = True
        for msg in self.out.values():
            msg.state = "lost"


def reservation(n: int, last: int, since: float) -> int:
    """How many deliveries a hand-out counts ahead: ``n``, or twice the ``last``
    reservation (up to RESERVE_MAX) when that was made ``since`` < a second ago."""
    if since < _RESERVE_GROWS_WITHIN_S:
        return max(n, min(2 * last, RESERVE_MAX))
    return n


def _same(progress: Progress) -> Progress:
    return progress


class _ForkSafe(Protocol):
    def _after_fork(self) -> None: ...


#: Every live held segment and packed topic state, so a forked child gives them fresh
#: locks (a thread that held one at the fork does not exist there).
_RENEWED: weakref.WeakSet[Any] = weakref.WeakSet()


def renew_locks_after_fork(obj: _ForkSafe) -> None:
    """Call ``obj._after_fork()`` in a forked child of this process."""
    _RENEWED.add(obj)


def _reset_locks_after_fork() -> None:
    for obj in list(_RENEWED):
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)

__all__ = ["RESERVE_MAX", "HeldSegment", "renew_locks_after_fork", "reservation"]
