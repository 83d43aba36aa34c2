"""Segment leases of packed topics on the simulated S3, with hypothesis (issue 14's proof).

2-4 model consumers and 1-2 janitors (tests/segment_model.py) work 1-3 segments of 1-5
messages: they claim free segments and take over stale or released ones, hand messages
out (a write reserves up to 3, handed out one after another without a request while
that write is younger than ``visibility``; older, the lease is rewritten first), let
handlers ack, nack or retry them (and take longer than the visibility timeout),
dead-letter after ``max_delivery_count`` deliveries, give segments back (reserved
deliveries taken back), finish them (segment, then lease; or, an ack batch completing a
segment well inside the time fence, queue.packed's delete of the segment without
recording, then of the lease); any of them crashes after any of its effects (after the claim,
between a handler's ack and its recording, during a takeover, between the segment's
DELETE and the lease's, ...). Then, every crashed actor's lease gone stale, one clean
consumer and one janitor pass run. For every message:

* it is settled in the end (acked or dead-lettered), with nothing left in the bucket;
* it is delivered until its settlement is recorded: the recorded settlement is the
  decision of the handler of its last delivery (or a dead letter after
  ``max_delivery_count``), and it is never delivered again after that was recorded;
* it is never handed out under two live leases: the windows in which holders may hand
  out a segment's messages (from the answer of a claim, takeover or record until
  ``visibility`` after it was sent, or until the holder gives it back) never overlap
  (the consumer's own fence, ``visibility - margin``, lies inside such a window);
* every hand-out was recorded before it happened, and its recorded count covers every
  delivery so far, across takeovers; it is delivered at most ``max_delivery_count``
  times, and dead-lettered by exhaustion exactly when that many deliveries were recorded
  without a settlement (the dead letter is written before the settlement is recorded);
* progress is never lost: what a successful write recorded is in every later version of
  the lease while the segment exists.

``conditional_write`` (If-None-Match and If-Match honoured) for any delays up to 2 s each
way; ``csprng_verify`` with If-Match honoured or not, every one-way delay below
``jitter_min_ms`` (the bound of docs/guarantees.md).
"""

from __future__ import annotations

import types

import attrs
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from pawn_queue_sync import layout
from pawn_queue_sync.errors import LeaseLostError
from pawn_queue_sync.protocol import segments as seg
from pawn_queue_sync.protocol.effects import Delete, Put
from pawn_queue_sync.protocol.lease import _still_ours as still_ours
from pawn_queue_sync.protocol.lease import release
from tests import segment_model
from tests.segment_checks import check
from tests.segment_model import (
    BOTH,
    BOUND,
    IF_MATCH_ONLY,
    NEITHER,
    OUTCOMES,
    PHASES,
    TOPIC,
    VISIBILITY,
    ConsumerPlan,
    Crash,
    Handling,
    JanitorPlan,
    World,
    run_world,
    segment_id,
)

#: The crash points issue 14 names: after the claim (entering the read of the segment),
#: between a handler's ack and its recording, during a takeover (after its GET; after
#: its write, or its check without If-Match), between the segment's DELETE and the lease's.
NAMED_CRASHES = (Crash("read", 0), Crash("record", 0), Crash("take", 1), Crash("take", 2),
                 Crash("finish", 1))

FAST = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def worlds(draw, caps, max_delay: float):
    # Extremes often: the races that matter sit at the edges of the allowed delays.
    top = max_delay * 0.999
    delay = st.one_of(st.sampled_from([0.0, top]), st.floats(0.0, min(top, 0.01)),
                      st.floats(0.0, top))
    delays = st.lists(st.tuples(delay, delay), min_size=1, max_size=8).map(tuple)
    pause = st.one_of(st.just(0.0), st.floats(0.0, 2 * VISIBILITY))
    # Work often ends, and consumers often start, just as a lease written at the start
    # turns stale (visibility + 1 s grace): the races of a late record with a takeover.
    stale = st.floats(VISIBILITY + 0.9, VISIBILITY + 1.3)
    work = st.one_of(st.just(0.0), st.floats(0.0, 2.5 * VISIBILITY), stale)
    handling = st.builds(Handling, work=work, outcome=st.sampled_from(OUTCOMES))
    crash = st.one_of(
        st.none(),
        st.sampled_from(NAMED_CRASHES),
        st.builds(Crash, st.none(), st.integers(0, 60)),
        st.builds(Crash, st.sampled_from(PHASES), st.one_of(st.just(0), st.integers(0, 4)),
                  st.one_of(st.just(0), st.integers(0, 2))),
    )
    consumer = st.builds(
        ConsumerPlan, start=st.one_of(st.just(0.0), st.floats(0.0, 2 * VISIBILITY), stale),
        delays=delays, seed=st.integers(0, 2**32 - 1), want=st.integers(1, 3),
        handling=st.lists(handling, min_size=1, max_size=4).map(tuple), crash=crash,
        rounds=st.integers(1, 4), pause=pause,
        close_after=st.one_of(st.none(), st.integers(1, 3)), fast_finish=st.booleans(),
    )
    janitor = st.builds(JanitorPlan, passes=st.lists(pause, min_size=1, max_size=6).map(tuple),
                        delays=delays)
    return World(
        caps, draw(st.sampled_from([0.0, 1.0])),
        tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))),
        tuple(draw(st.lists(consumer, min_size=2, max_size=4))),
        tuple(draw(st.lists(janitor, min_size=1, max_size=2))),
    )


def prove(w: World) -> None:
    sim, log = run_world(w)
    for end in log.ends.values():  # what the runs covered (--hypothesis-show-statistics)
        event(end.split(" #")[0])
    for wr in log.writes:
        event(f"lease write: {wr.kind}")
    if log.fast:
        event("segment deleted by an ack batch")
    check(w, sim, log)


@FAST
@given(worlds(BOTH, max_delay=2.0))
def test_conditional_write_any_delays(w):
    prove(w)


#: A late record racing a takeover (found by sweeping c1's start; hypothesis rarely
#: draws it): c0's handler ends as its lease turns stale; c1 checks the stale version
#: just before c0's rewrite lands and writes its takeover just after. Without If-Match,
#: only the record's confirmation (2 x jitter_min later) tells c0 it lost the lease.
LATE_RECORD_RACING_A_TAKEOVER = World(
    NEITHER, 0.0, (3,),
    (ConsumerPlan(0.0, ((0.02, 0.02),), 0, 1, (Handling(4.0, "ack"),)),
     ConsumerPlan(4.385, ((0.02, 0.02),), 1, 3, (Handling(0.0, "ack"),), rounds=1)),
    (JanitorPlan((0.0,), ((0.0, 0.0),)),),
)


@FAST
@given(worlds(IF_MATCH_ONLY, max_delay=BOUND))
@example(attrs.evolve(LATE_RECORD_RACING_A_TAKEOVER, caps=IF_MATCH_ONLY))
def test_csprng_with_if_match_within_the_bound(w):
    prove(w)


@FAST
@given(worlds(NEITHER, max_delay=BOUND))
@example(LATE_RECORD_RACING_A_TAKEOVER)
def test_csprng_without_if_match_within_the_bound(w):
    prove(w)


# -- the named crash points, explicitly ---------------------------------------------------------

CAPS = pytest.mark.parametrize("caps", [BOTH, IF_MATCH_ONLY, NEITHER],
                               ids=["conditional", "csprng", "csprng-no-if-match"])
SID = segment_id(0)


def plan(start: float = 0.0, *, crash: Crash | None = None, want: int = 3,
         handling: tuple[Handling, ...] = (Handling(0.0, "ack"),), rounds: int = 8,
         pause: float = 2.0, close_after: int | None = None) -> ConsumerPlan:
    """A consumer with 1 ms delays that polls every ``pause`` seconds."""
    return ConsumerPlan(start=start, delays=((0.001, 0.001),), seed=0, want=want,
                        handling=handling, crash=crash, rounds=rounds, pause=pause,
                        close_after=close_after)


def scenario(caps, *consumers: ConsumerPlan, janitor: tuple[float, ...] = (1.0,),
             messages: int = 3):
    w = World(caps, 0.0, (messages,), consumers, (JanitorPlan(janitor, ((0.001, 0.001),)),))
    sim, log = run_world(w)
    check(w, sim, log)
    return sim, log


def delivered(log, index: int) -> list[str]:
    return [d.consumer for d in log.deliveries if (d.segment, d.index) == (SID, index)]


def recorded(sim, log, consumer: str, kind: str):
    """The progress of ``consumer``'s first successful ``kind`` write."""
    wr = next(w for w in log.writes if (w.consumer, w.kind) == (consumer, kind))
    return next(seg.SegmentLease.decode(e.after.body).progress for e in sim.log
                if e.after is not None and e.after.etag == wr.token)


@CAPS
def test_a_crash_after_the_claim_counts_the_hand_out(caps):
    """c0 claims (recording deliveries of 0 and 1) and dies before reading the segment;
    c1 takes the stale lease over: it delivers them as their second delivery."""
    sim, log = scenario(caps, plan(crash=Crash("read", 0), want=2), plan(0.5))
    assert log.ends["c0"] == "crashed: read #0"
    assert [delivered(log, i) for i in range(3)] == [["c1"]] * 3
    taken = recorded(sim, log, "c1", "take")
    assert [taken.deliveries_of(i) for i in range(3)] == [2, 2, 1]


@CAPS
def test_a_crash_between_the_ack_and_its_recording_redelivers(caps):
    """c0's handler acks message 0 and c0 dies before recording it: c1 delivers it again
    (recorded as its second delivery); the others once."""
    sim, log = scenario(caps, plan(crash=Crash("record", 0), want=1), plan(0.5))
    assert log.ends["c0"] == "crashed: record #0"
    assert [delivered(log, i) for i in range(3)] == [["c0", "c1"], ["c1"], ["c1"]]
    assert recorded(sim, log, "c1", "take").deliveries_of(0) == 2


@CAPS
@pytest.mark.parametrize("nth", [1, 2])
def test_a_crash_during_a_takeover_loses_nothing(caps, nth):
    """c0's handler outlives the lease; c1 takes it over and dies after its GET (nth 1)
    or after its write (check, without If-Match) (nth 2); c2 takes over later. Message 0
    is settled once by whoever holds it; every message is settled."""
    _sim, log = scenario(caps, plan(want=3, handling=(Handling(10.0, "ack"),)),
                        plan(0.5, crash=Crash("take", nth)), plan(1.0, rounds=10))
    assert log.ends["c1"] == f"crashed: take #{nth}"
    assert delivered(log, 0)[0] == "c0"
    assert not any(d.consumer == "c1" for d in log.deliveries)


@CAPS
def test_a_crash_between_the_segment_delete_and_the_lease_delete(caps):
    """c0 settles everything, deletes the segment and dies: the janitor removes the
    lease once stale; every message was delivered once."""
    sim, log = scenario(caps, plan(crash=Crash("finish", 1)), plan(0.5),
                        janitor=(2.0, 2.0, 2.0))
    assert log.ends["c0"] == "crashed: finish #1"
    assert [delivered(log, i) for i in range(3)] == [["c0"]] * 3
    lease = layout.segment_lease_key(TOPIC, SID)
    assert [(e.actor, e.op) for e in sim.log if e.key == lease][-1] == ("j0", "delete")


# -- the checks fail on a protocol that breaks a rule ---------------------------------------------


def broken(monkeypatch, name: str, protocol) -> None:
    """The model consumer runs with ``protocol`` in place of segments.``name``."""
    fake = types.SimpleNamespace(**{n: getattr(seg, n) for n in seg.__all__})
    setattr(fake, name, protocol)
    monkeypatch.setattr(segment_model, "seg", fake)


def take_over_forgetting_acks(caps, key, seen_etag, lease, csprng):
    lease = attrs.evolve(lease, progress=attrs.evolve(lease.progress, settled=()))
    return (yield from seg.take_over(caps, key, seen_etag, lease, csprng))


def record_unfenced(caps, key, token, lease, csprng):
    return (yield Put(key, lease.encode())).etag


def record_unconfirmed(caps, key, token, lease, csprng):
    """Without If-Match: check, then write, and no second look."""
    if not (yield from still_ours(key, token)):
        raise LeaseLostError(lease.message_id)
    return (yield Put(key, lease.encode())).etag


def finish_lease_first(caps, key, token, segment_key):
    yield from release(key, token, caps)
    yield Delete(segment_key)


@pytest.mark.parametrize(("name", "protocol", "crash", "found"), [
    ("take_over", take_over_forgetting_acks, None, "unsettled in c1's version"),
    ("record", record_unfenced, None, "delivery 2 recorded as 1"),
    ("finish", finish_lease_first, Crash("finish", 1), "its segment still there"),
], ids=["takeover-loses-acks", "record-without-if-match", "lease-deleted-first"])
def test_the_checks_catch_a_broken_protocol(monkeypatch, name, protocol, crash, found):
    """c0 acks message 0, then its handler outlives the lease on message 1; c1 takes
    over. Each broken protocol breaks a rule the checks name."""
    broken(monkeypatch, name, protocol)
    with pytest.raises(AssertionError, match=found):
        scenario(BOTH, plan(want=1, handling=(Handling(0.0, "ack"), Handling(6.0, "ack")),
                            crash=crash), plan(0.5))


def test_the_checks_catch_a_record_without_its_confirmation(monkeypatch):
    """LATE_RECORD_RACING_A_TAKEOVER with a record that does not look again: c0 goes
    on handing out under a version c1 has overwritten."""
    broken(monkeypatch, "record", record_unconfirmed)
    with pytest.raises(AssertionError, match=r"c0 may hand out in .* and c1 in"):
        sim, log = run_world(LATE_RECORD_RACING_A_TAKEOVER)
        check(LATE_RECORD_RACING_A_TAKEOVER, sim, log)


@CAPS
@pytest.mark.parametrize("crash", [None, Crash("finish", 1)], ids=["", "finish-crash"])
def test_the_same_schedule_holds_with_the_real_protocols(caps, crash):
    """The schedule above, with protocol.segments as it is: c1 takes the lease over
    carrying c0's ack (message 0 is never delivered again); c0's late ack of message 1
    finds the lease taken (it is delivered again, by c1)."""
    _sim, log = scenario(caps, plan(want=1, handling=(Handling(0.0, "ack"), Handling(6.0, "ack")),
                                    crash=crash), plan(0.5))
    assert delivered(log, 0) == ["c0"]
    assert delivered(log, 1) == ["c0", "c1"]
