"""A model consumer of packed topics on the simulated S3 (tests/sim_s3.py).

The consumer is built from the protocols of ``pawn_queue_sync.protocol.segments`` (claim,
take over, record, finish) and the pure ``Progress`` logic, as ``queue.packed`` uses them:
it lists segments and their leases; claims a free segment (the claim records the first
hand-out) or takes over a stale or released lease (carrying its progress, adding our
hand-out); "delivers" the messages a write reserved (appends to a shared log) one after
another, each only while that write is younger than ``VISIBILITY`` (older: the lease is
rewritten first, as queue.held does); lets a handler settle each one (ack, nack, retry);
dead-letters a message whose recorded deliveries reached ``MAX_DELIVERY`` (PUT of the
dead letter, then the recording); records the settlements and the next hand-out in one
write (a group commit); gives the segment back (``released``, reserved deliveries taken
back) when its plan says so; and, when every message is settled, deletes the segment,
then the lease (or, for an ack batch completing the segment well inside the fence,
queue.packed's delete of the segment without recording, then of the lease). A janitor removes
a lease whose segment is gone, once stale. Any actor may crash: it stops for good after a
chosen effect (counted in all, or within a named phase).

tests/segment_checks.py then proves the guarantees for packed topics, per message, from
the shared log and the server's log of applied writes.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable, Generator
from datetime import timedelta
from typing import Any

import attrs

from pawn_queue_sync import layout
from pawn_queue_sync.errors import LeaseLostError, ObjectNotFound
from pawn_queue_sync.protocol import segments as seg
from pawn_queue_sync.protocol.effects import Delete, Effect, Get, List, Put, Sleep
from pawn_queue_sync.protocol.lease import Capabilities, CsprngSettings, is_stale, reap
from tests.sim_s3 import ORIGIN, SimS3, Version

TOPIC = "orders"
VISIBILITY = 3.0
MAX_DELIVERY = 3
CSPRNG = CsprngSettings(jitter_min_ms=50, jitter_max_ms=120, verify_retries=1,
                        verify_retry_delay_ms=30)
#: Virtual seconds a run may take: every actor must have ended by then (no livelock).
HORIZON = 1000.0
#: The csprng_verify bound: every one-way delay below jitter_min (docs/guarantees.md).
BOUND = CSPRNG.jitter_min_ms / 1000
#: How long after sending a lease write its holder may act on it alone (queue.held:
#: visibility - max(2 s, 20 %)), and the room an ack batch keeps before that to delete a
#: completed segment without recording (queue.packed: min(1 s, a quarter of it)).
FENCE = VISIBILITY - max(2.0, 0.2 * VISIBILITY)
FINISH_ROOM = min(1.0, FENCE / 4)
#: Where a consumer can be when it crashes (see :class:`Crash`).
PHASES = ("poll", "claim", "take", "read", "dead-letter", "deliver", "handle", "record",
          "finish")
OUTCOMES = ("ack", "nack", "retry")

BOTH = Capabilities(if_none_match=True, if_match=True)  # conditional_write
IF_MATCH_ONLY = Capabilities(if_none_match=False, if_match=True)  # csprng_verify
NEITHER = Capabilities(if_none_match=False, if_match=False)  # csprng_verify, no If-Match


# -- the world a test draws ------------------------------------------------------------------


@attrs.frozen
class Handling:
    """What a handler does with one delivery: works ``work`` seconds, then settles."""

    work: float
    outcome: str  # one of OUTCOMES


@attrs.frozen
class Crash:
    """The actor stops for good (a killed process). ``phase`` None: after its ``nth``
    answered effect in all. Otherwise after the ``nth`` answered effect of the
    ``times``-th time it enters ``phase`` (``nth`` 0: as it enters, before any request),
    e.g. ("record", 0) is between a handler's settlement and its recording, ("finish", 1)
    between the segment's DELETE and the lease's."""

    phase: str | None
    nth: int
    times: int = 0


@attrs.frozen
class ConsumerPlan:
    start: float
    delays: tuple[tuple[float, float], ...]  # (to server, back) per request; the last repeats
    seed: int
    want: int  # messages per hand-out
    handling: tuple[Handling, ...]  # per delivery, cycled
    crash: Crash | None = None
    rounds: int = 3  # polls
    pause: float = 0.0  # between polls
    close_after: int | None = None  # give the segment back after this many records
    #: an ack batch completing the segment deletes it without recording, inside the fence
    fast_finish: bool = False


@attrs.frozen
class JanitorPlan:
    passes: tuple[float, ...]  # pause before each pass
    delays: tuple[tuple[float, float], ...]


@attrs.frozen
class World:
    caps: Capabilities
    resolution: float  # LastModified/Date resolution of the server
    segments: tuple[int, ...]  # messages per segment
    consumers: tuple[ConsumerPlan, ...]
    janitors: tuple[JanitorPlan, ...]


def segment_id(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def message_id(sid: str, index: int) -> str:
    return f"{sid[:8]}-{index:04x}-4000-8000-{sid[-12:]}"


def segment_key_of(n: int, count: int) -> str:
    return layout.segment_key(TOPIC, f"20260101T000000_{n:06d}", segment_id(n), count)


# -- the shared log ----------------------------------------------------------------------


@attrs.frozen
class Delivery:
    at: float
    consumer: str
    segment: str
    index: int
    token: str  # the lease version whose write recorded this hand-out
    pos: int  # how many writes the server had applied then (orders it among them)


@attrs.frozen
class Decision:
    at: float
    consumer: str
    segment: str
    index: int
    outcome: str  # ack, nack, retry, or exhausted (dead-lettered, not handed out)
    delivery: int | None  # the delivery (index in Log.deliveries) it settles
    pos: int  # how many writes the server had applied then
    recorded: int = 0  # exhausted: the recorded deliveries it was decided on


@attrs.frozen
class Write:
    """A lease write that returned a token (claim, take, record)."""

    kind: str
    consumer: str
    segment: str
    token: str
    sent: float
    answered: float


@attrs.define
class Log:
    deliveries: list[Delivery] = attrs.field(factory=list)
    decisions: list[Decision] = attrs.field(factory=list)
    writes: list[Write] = attrs.field(factory=list)
    #: segment -> [start, end, consumer, fence]: when that consumer may hand out its
    #: messages (``end``: the time fence, or earlier when it stopped acting)
    windows: dict[str, list[list[Any]]] = attrs.field(factory=lambda: defaultdict(list))
    ends: dict[str, str] = attrs.field(factory=dict)  # actor -> how it ended
    #: (consumer, segment): segments deleted by an ack batch without recording it
    fast: list[tuple[str, str]] = attrs.field(factory=list)


class Crashed(Exception):
    """Raised inside a consumer to stop it where its plan says."""


def watched(gen: Generator[Effect, Any, Any], answered: Callable[[], bool]) -> Generator[
    Effect, Any, Any
]:
    """Run ``gen``, calling ``answered`` after each effect's result; it returning True
    stops ``gen`` for good there (nothing more is sent)."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = gen.throw(error) if error is not None else gen.send(result)
        except StopIteration as stop:
            return stop.value
        except Crashed:
            return "crashed"
        try:
            result, error = (yield effect), None
        except Exception as exc:  # handed to the protocol, as the runner does
            result, error = None, exc
        if answered():
            gen.close()
            return "crashed"


# -- the consumer --------------------------------------------------------------------------


@attrs.define
class Held:
    """A segment this consumer holds: its lease as last written and that write's token."""

    sid: str
    skey: str
    lkey: str
    count: int
    lease: Any
    token: str
    sent: float  # when the write of ``token`` was sent (the start of its time fence)


class ModelConsumer:
    def __init__(self, sim: SimS3, name: str, plan: ConsumerPlan, caps: Capabilities,
                 log: Log) -> None:
        self.sim, self.name, self.plan, self.caps, self.log = sim, name, plan, caps, log
        self.rng = random.Random(plan.seed)
        self.phase = "poll"
        self.entries: dict[str, int] = defaultdict(int)
        self.in_phase = 0
        self.total = 0
        self.handled = 0

    # crash points ----------------------------------------------------------------------

    def actor(self) -> Generator[Effect, Any, Any]:
        return watched(self.run(), self.answered)

    def enter(self, phase: str) -> None:
        self.phase, self.in_phase = phase, 0
        self.entries[phase] += 1
        if self._due():
            raise Crashed(phase)

    def answered(self) -> bool:
        self.total += 1
        self.in_phase += 1
        return self._due()

    def _due(self) -> bool:
        c = self.plan.crash
        if c is None:
            return False
        if c.phase is None:
            due = self.total == c.nth
        else:
            due = (c.phase == self.phase and self.entries[c.phase] == c.times + 1
                   and self.in_phase == c.nth)
        if due:
            self.log.ends[self.name] = f"crashed: {self.phase} #{self.in_phase}"
        return due

    # the consumer ----------------------------------------------------------------------

    def run(self) -> Generator[Effect, Any, str]:
        for _ in range(self.plan.rounds):
            self.enter("poll")
            target = yield from self.pick()
            if target is not None:
                yield from self.work(*target)
            yield Sleep(self.plan.pause)
        self.log.ends.setdefault(self.name, "done")
        return "done"

    def wall(self):
        return ORIGIN + timedelta(seconds=self.sim.now)

    def pick(self) -> Generator[Effect, Any, tuple | None]:
        """A segment to work on: free (claim) or under a stale or released lease (take
        over); None when there is none."""
        segments = yield List(layout.segments_prefix(TOPIC))
        leases = yield List(layout.segment_leases_prefix(TOPIC))
        held = {layout.segment_lease_id(TOPIC, o.key): o for o in leases.objects}
        options = []
        for o in segments.objects:
            sid, count = layout.parse_segment_key(TOPIC, o.key)
            info = held.get(sid)
            if info is None:
                options.append(("claim", sid, o.key, count, None))
            elif is_stale(info.last_modified, leases.server_time, VISIBILITY):
                options.append(("take", sid, o.key, count, info.etag))
            else:
                try:
                    got = yield Get(info.key)
                except ObjectNotFound:
                    continue
                if got.etag == info.etag and seg.SegmentLease.decode(got.body).released:
                    options.append(("take", sid, o.key, count, info.etag))
        return self.rng.choice(options) if options else None

    def new_lease(self, sid: str, skey: str, progress: Any) -> Any:
        return seg.SegmentLease.new(self.name, sid, skey, self.wall(), VISIBILITY, progress)

    def work(self, mode: str, sid: str, skey: str, count: int, etag: str | None):
        lkey = layout.segment_lease_key(TOPIC, sid)
        want = self.plan.want
        self.enter(mode)
        sent = self.sim.now
        if mode == "claim":
            progress, handed, exhausted = seg.Progress(count=count).hand_out(
                list(range(min(want, count))), MAX_DELIVERY)
            lease = self.new_lease(sid, skey, progress)
            token = yield from seg.claim_segment(self.caps, lkey, lease, CSPRNG, self.rng)
        else:
            loaded = yield from seg.load(lkey)
            if loaded is None or loaded[1] != etag:
                return  # not the version judged stale or released: leave it
            old = loaded[0]
            progress, handed, exhausted = old.progress.with_count(count).hand_out(
                old.progress.unsettled(count)[:want], MAX_DELIVERY)
            lease = old.rewritten(self.wall(), VISIBILITY, progress, consumer_id=self.name)
            sent = self.sim.now  # the fence runs from the write (queue.segment_claims)
            token = yield from seg.take_over(self.caps, lkey, etag, lease, CSPRNG)
        if token is None:
            return
        h = Held(sid, skey, lkey, count, lease, token, sent)
        self.wrote(mode, h)
        self.enter("read")
        try:
            yield Get(skey)
        except ObjectNotFound:  # settled and deleted meanwhile: our lease goes too
            yield from self.finish(h)
            return
        records = 0
        reserved = list(handed)  # counted in the lease, not yet handed to a handler
        while True:
            settled: dict[int, str] = {}
            for i in exhausted:  # dead letter first, then its recording
                self.enter("dead-letter")
                self.decide(h, i, "exhausted", None, h.lease.progress.deliveries_of(i))
                yield from self.dead_letter(sid, i, "exhausted")
                settled[i] = "exhausted"
            # Reserved messages go out without a request while our last write is inside
            # its fence; past it, the lease is rewritten first (below).
            while reserved and self.sim.now < h.sent + VISIBILITY:
                i = reserved.pop(0)
                self.enter("deliver")
                d = len(self.log.deliveries)
                self.log.deliveries.append(
                    Delivery(self.sim.now, self.name, sid, i, h.token, len(self.sim.log)))
                self.enter("handle")
                todo = self.plan.handling[self.handled % len(self.plan.handling)]
                self.handled += 1
                yield Sleep(todo.work)
                self.decide(h, i, todo.outcome, d)
                if todo.outcome == "nack":
                    yield from self.dead_letter(sid, i, "nack")
                settled[i] = todo.outcome
            if reserved and not settled and records:
                self.close_windows(sid)  # even a rewrite's answer comes past its fence
                return  # (a store this slow): abandoned, the lease goes stale
            p = h.lease.progress.settle([i for i, o in settled.items() if o != "retry"])
            for i, o in settled.items():
                if o == "retry":
                    p = p.with_error(i, "handler failed")
            if (self.plan.fast_finish and p.complete and settled
                    and set(settled.values()) == {"ack"}
                    and self.sim.now + FINISH_ROOM < h.sent + FENCE):
                yield from self.fast_finish(h)
                return
            records += 1
            give_back = self.plan.close_after is not None and records >= self.plan.close_after
            if give_back:  # the reserved deliveries are taken back
                p, reserved = p.release(reserved), []
            elif not reserved and not p.complete:
                p, handed, exhausted = p.hand_out(p.unsettled(count)[:want], MAX_DELIVERY)
                reserved = list(handed)
            else:
                exhausted = []
            lease = h.lease.rewritten(self.wall(), VISIBILITY, p, released=give_back)
            if give_back:
                self.close_windows(sid)
            self.enter("record")
            sent = self.sim.now
            try:
                token = yield from seg.record(self.caps, lkey, h.token, lease, CSPRNG)
            except LeaseLostError:
                self.close_windows(sid)
                return
            h.lease, h.token, h.sent = lease, token, sent
            self.wrote("record", h)
            if give_back:
                return
            if p.complete:
                yield from self.finish(h)
                return

    def wrote(self, kind: str, h: Held) -> None:
        self.log.writes.append(Write(kind, self.name, h.sid, h.token, h.sent, self.sim.now))
        if not h.lease.released:
            fence = h.sent + VISIBILITY
            self.log.windows[h.sid].append([self.sim.now, fence, self.name, fence])

    def close_windows(self, sid: str) -> None:
        """We stop acting on the segment: no hand-out of ours from now on."""
        for w in self.log.windows[sid]:
            if w[2] == self.name:
                w[1] = min(w[1], self.sim.now)

    def decide(self, h: Held, i: int, outcome: str, delivery: int | None,
               recorded: int = 0) -> None:
        self.log.decisions.append(
            Decision(self.sim.now, self.name, h.sid, i, outcome, delivery, len(self.sim.log),
                     recorded))

    def dead_letter(self, sid: str, i: int, reason: str):
        body = json.dumps({"id": message_id(sid, i), "reason": reason}).encode()
        yield Put(layout.dead_letter_key(TOPIC, message_id(sid, i)), body)

    def fast_finish(self, h: Held):
        """queue.packed's ack batch completing a segment well inside the fence: DELETE
        the segment (that settles every message for good), then the lease, unconditionally."""
        self.close_windows(h.sid)
        self.enter("finish")
        self.log.fast.append((self.name, h.sid))
        yield Delete(h.skey)
        yield Delete(h.lkey)

    def finish(self, h: Held):
        self.close_windows(h.sid)
        self.enter("finish")
        yield from seg.finish(self.caps, h.lkey, h.token, h.skey)


def janitor(plan: JanitorPlan, caps: Capabilities) -> Generator[Effect, Any, str]:
    """Removes, once stale, the leases whose segment is gone (a finisher crashed between
    the two DELETEs). Leases are listed first: a segment absent after that is gone."""
    for pause in plan.passes:
        yield Sleep(pause)
        leases = yield List(layout.segment_leases_prefix(TOPIC))
        segments = yield List(layout.segments_prefix(TOPIC))
        present = {layout.parse_segment_key(TOPIC, o.key)[0] for o in segments.objects}
        for o in leases.objects:
            if (layout.segment_lease_id(TOPIC, o.key) not in present
                    and is_stale(o.last_modified, leases.server_time, VISIBILITY)):
                yield from reap(o.key, o.etag, caps)
    return "done"


# -- running a world -----------------------------------------------------------------------


def run_world(w: World) -> tuple[SimS3, Log]:
    """Run the world, then (every crashed actor's lease gone stale) one clean consumer
    and one janitor pass; returns the simulator and the shared log."""
    sim = SimS3(if_none_match=w.caps.if_none_match, if_match=w.caps.if_match,
                time_resolution=w.resolution)
    for n, count in enumerate(w.segments):
        sim.objects[segment_key_of(n, count)] = Version(b"segment %d" % n, f"s{n}", 0.0, "producer")
    log = Log()
    for i, plan in enumerate(w.consumers):
        c = ModelConsumer(sim, f"c{i}", plan, w.caps, log)
        sim.spawn(c.name, c.actor(), start=plan.start, delays=list(plan.delays))
    for i, j in enumerate(w.janitors):
        sim.spawn(f"j{i}", janitor(j, w.caps), delays=list(j.delays))
    _all_ended(sim.run(until=sim.now + HORIZON))
    clean = ConsumerPlan(start=sim.now + VISIBILITY + 3.0, delays=((0.0, 0.0),), seed=0,
                         want=5, handling=(Handling(0.0, "ack"),),
                         rounds=len(w.segments) + 1)
    final = ModelConsumer(sim, "final", clean, w.caps, log)
    sim.spawn("final", final.actor(), start=clean.start)
    _all_ended(sim.run(until=sim.now + HORIZON))
    sim.spawn("jfinal", janitor(JanitorPlan((0.0,), ((0.0, 0.0),)), w.caps), start=sim.now)
    _all_ended(sim.run(until=sim.now + HORIZON))
    return sim, log


def _all_ended(outcomes) -> None:
    for name, out in outcomes.items():
        assert out.done and out.error is None, (name, out.error)
