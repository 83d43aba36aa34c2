"""Fencing of refresh, release and reap on the simulated S3, with hypothesis.

Several holders contend for one lease over a long stretch of virtual time: each claims,
keeps the lease for a while (often past its visibility timeout, so it goes stale),
then refreshes and/or releases it; janitors judge it by the server's clock and reap it.

Checked:

* **entitlement windows never overlap.** A holder may act on the message (ack, nack)
  from the answer of a successful claim or refresh until ``visibility`` after it sent
  that request (the time fence of ``Consumer.ack_many``, with no margin) or until it
  starts releasing. No two holders' windows overlap, ever.
* **a stale holder never removes or overwrites another's lease** (servers with
  If-Match): every refresh PUT and release DELETE the server applies replaces the
  holder's own version.
* **the janitor only removes a lease older than the visibility timeout** by the
  server's clock, whatever the skew of the holders' clocks.

With If-None-Match and If-Match this holds for any delays. On servers without them
(csprng_verify claims, verify-then-act refresh/release/reap) it holds when every
one-way delay is below ``jitter_min_ms``, the bound of docs/guarantees.md.
"""

from __future__ import annotations

import random
from datetime import timedelta

import attrs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pawn_queue_sync.errors import LeaseLostError
from pawn_queue_sync.protocol.effects import Get, Put, Sleep
from pawn_queue_sync.protocol.lease import (
    Capabilities,
    CsprngSettings,
    LeaseBody,
    claim,
    is_stale,
    reap,
    refresh,
    release,
)
from tests.sim_s3 import ORIGIN, SimS3

KEY = "orders/leases/m.lease"
VISIBILITY = 3.0
CSPRNG = CsprngSettings(jitter_min_ms=50, jitter_max_ms=120, verify_retries=1,
                        verify_retry_delay_ms=30)

FAST = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@attrs.frozen
class Holder:
    start: float
    skew: float  # the holder's wall clock minus the server's, seconds
    plan: tuple[tuple[float, str], ...]  # (pause, "refresh" | "release") after the claim
    delays: tuple[tuple[float, float], ...]
    seed: int


@attrs.frozen
class Janitor:
    passes: tuple[float, ...]  # pause before each pass
    delays: tuple[tuple[float, float], ...]


@attrs.frozen
class World:
    caps: Capabilities
    resolution: float
    holders: tuple[Holder, ...]
    janitors: tuple[Janitor, ...]


@st.composite
def worlds(draw, caps: Capabilities, max_delay: float):
    delay = st.floats(0.0, max_delay, exclude_max=True, allow_nan=False)
    delays = st.lists(st.tuples(delay, delay), min_size=1, max_size=6).map(tuple)
    pause = st.floats(0.0, 2.5 * VISIBILITY)
    plan = st.lists(st.tuples(pause, st.sampled_from(["refresh", "release"])), max_size=4)
    holders = st.lists(
        st.builds(Holder, start=st.floats(0.0, 4 * VISIBILITY), skew=st.floats(-3600, 3600),
                  plan=plan.map(tuple), delays=delays, seed=st.integers(0, 2**32 - 1)),
        min_size=2, max_size=5,
    )
    janitors = st.lists(
        st.builds(Janitor, passes=st.lists(pause, min_size=1, max_size=8).map(tuple),
                  delays=delays),
        min_size=1, max_size=3,
    )
    return World(caps, draw(st.sampled_from([0.0, 1.0])), tuple(draw(holders)),
                 tuple(draw(janitors)))


@attrs.define
class Record:
    windows: list[list] = attrs.field(factory=list)  # [start, end, holder]
    claim_tokens: dict[str, str] = attrs.field(factory=dict)
    refresh_tokens: set[str] = attrs.field(factory=set)


def holder(sim: SimS3, name: str, h: Holder, caps: Capabilities, rec: Record):
    def body() -> LeaseBody:
        client_now = ORIGIN + timedelta(seconds=sim.now + h.skew)
        return LeaseBody.new(name, "m", client_now, VISIBILITY)

    sent = sim.now
    token = yield from claim(caps, KEY, body(), CSPRNG, random.Random(h.seed))
    if token is None:
        return "lost the claim"
    rec.claim_tokens[name] = token
    window = [sim.now, sent + VISIBILITY, name]
    rec.windows.append(window)
    for pause, action in h.plan:
        yield Sleep(pause)
        if action == "release":
            for w in rec.windows:  # no acting once we give it back, on any token of ours
                if w[2] == name:
                    w[1] = min(w[1], sim.now)
            yield from release(KEY, token, caps)
            return "released"
        sent, new = sim.now, body()
        try:
            token = yield from refresh(KEY, token, new, caps, CSPRNG)
        except LeaseLostError:
            return "lease lost"
        rec.refresh_tokens.add(token)
        window = [sim.now, sent + VISIBILITY, name]
        rec.windows.append(window)
    return "kept"


def janitor(sim: SimS3, j: Janitor, caps: Capabilities):
    for pause in j.passes:
        yield Sleep(pause)
        try:
            seen = yield Get(KEY)  # stands in for the LIST entry and the listing's Date
        except LookupError:
            continue
        if is_stale(seen.last_modified, seen.server_time, VISIBILITY):
            yield from reap(KEY, seen.etag, caps)


def run_world(w: World) -> tuple[SimS3, Record]:
    sim = SimS3(if_none_match=w.caps.if_none_match, if_match=w.caps.if_match,
                time_resolution=w.resolution)
    rec = Record()
    for i, h in enumerate(w.holders):
        sim.spawn(f"h{i}", holder(sim, f"h{i}", h, w.caps, rec), start=h.start,
                  delays=list(h.delays))
    for i, j in enumerate(w.janitors):
        sim.spawn(f"j{i}", janitor(sim, j, w.caps), delays=list(j.delays))
    outcomes = sim.run()
    for name, out in outcomes.items():
        assert out.done and out.error is None, (name, out.error)
    return sim, rec


def check(w: World) -> None:
    sim, rec = run_world(w)
    windows = [(s, e, n) for s, e, n in rec.windows if s < e]
    for i, (s1, e1, n1) in enumerate(windows):
        for s2, e2, n2 in windows[i + 1 :]:
            assert n1 == n2 or max(s1, s2) >= min(e1, e2), (
                f"{n1} may act in [{s1:.4f}, {e1:.4f}) and {n2} in [{s2:.4f}, {e2:.4f})"
            )
    for e in sim.log:
        if e.actor.startswith("j"):
            assert e.op == "delete"
            if w.caps.if_match:
                assert e.at - e.before.written_at > VISIBILITY, "janitor removed a live lease"
            else:
                # Without If-Match a reap is check-then-delete: a late refresh of a lease
                # already stale can land in between and be removed (the refresh's re-check
                # then finds it gone: LeaseLostError). What must hold is that no holder was
                # entitled to act when its version was removed.
                assert not any(
                    n == e.before.writer and s <= e.at < end for s, end, n in windows
                ), f"janitor removed {e.before.writer}'s lease inside its window"
        elif w.caps.if_match and (e.op == "delete" or e.after.etag in rec.refresh_tokens):
            assert e.before is not None and e.before.writer == e.actor, (
                f"{e.actor}'s {e.op} at {e.at:.4f} replaced {e.before}"
            )


BOTH = Capabilities(if_none_match=True, if_match=True)
IF_MATCH_ONLY = Capabilities(if_none_match=False, if_match=True)
NEITHER = Capabilities(if_none_match=False, if_match=False)
IF_NONE_MATCH_ONLY = Capabilities(if_none_match=True, if_match=False)
BOUND = CSPRNG.jitter_min_ms / 1000


@FAST
@given(worlds(BOTH, max_delay=2.0))
def test_conditional_server_any_delays(w):
    check(w)


RELEASE_AFTER_REFRESH = World(  # found by hypothesis: a release closes every window
    IF_MATCH_ONLY, 0.0,
    (Holder(1.0, 0.0, (), ((0.0, 0.0),), 0),
     Holder(0.0, 0.0, ((0.0, "refresh"), (0.0, "release")), ((0.0, 0.0),), 0)),
    (Janitor((0.0,), ((0.0, 0.0),)),),
)


@FAST
@given(worlds(IF_MATCH_ONLY, max_delay=BOUND))
@example(RELEASE_AFTER_REFRESH)
@example(attrs.evolve(RELEASE_AFTER_REFRESH, caps=Capabilities(True, False)))
def test_csprng_claims_with_if_match_fencing_within_the_bound(w):
    check(w)


@FAST
@given(worlds(NEITHER, max_delay=BOUND))
def test_no_conditional_requests_at_all_within_the_bound(w):
    check(w)


LATE_REFRESH_OF_A_STALE_LEASE = World(  # found by hypothesis: reaped between check and PUT
    IF_NONE_MATCH_ONLY, 0.0,
    (Holder(1.0, 0.0, (), ((0.0, 0.0),), 0),
     Holder(0.0, 0.0, ((1.90625, "refresh"), (4.1875, "refresh")),
            ((0.0, 0.0), (0.0390625, 0.0)), 0)),
    (Janitor((0.0,), ((0.0, 0.0),)), Janitor((6.46875,), ((0.0, 0.03125),))),
)


@FAST
@given(worlds(IF_NONE_MATCH_ONLY, max_delay=BOUND))
@example(LATE_REFRESH_OF_A_STALE_LEASE)
@example(attrs.evolve(LATE_REFRESH_OF_A_STALE_LEASE, caps=NEITHER))
def test_if_none_match_without_if_match_within_the_bound(w):
    check(w)


@pytest.mark.parametrize("caps", [BOTH, IF_MATCH_ONLY], ids=["conditional", "csprng"])
def test_a_late_refresh_and_a_late_release_leave_the_new_holder_alone(caps):
    """The defect-3/4 schedule, explicitly: h0's lease goes stale, the janitor reaps
    it, h1 claims; then h0 refreshes (LeaseLostError) and releases (nothing removed)."""
    sim = SimS3(if_none_match=caps.if_none_match, if_match=caps.if_match)
    rec = Record()
    h0 = Holder(0.0, 0.0, ((10.0, "refresh"),), ((0.001, 0.001),), 1)
    h1 = Holder(6.0, 0.0, (), ((0.001, 0.001),), 2)
    out0 = sim.spawn("h0", holder(sim, "h0", h0, caps, rec), delays=list(h0.delays))
    sim.spawn("h1", holder(sim, "h1", h1, caps, rec), start=h1.start, delays=list(h1.delays))
    sim.spawn("j0", janitor(sim, Janitor((5.0,), ((0.001, 0.001),)), caps))

    def late_release():  # h0 gives back the lease it claimed, long after losing it
        return (yield from release(KEY, rec.claim_tokens["h0"], caps))

    stale_release = sim.spawn("h0-release", late_release(), start=11.0)
    sim.run()
    assert out0.value == "lease lost"
    assert stale_release.value is False
    assert sim.objects[KEY].writer == "h1"
    assert [(e.actor, e.op) for e in sim.log] == [("h0", "put"), ("j0", "delete"), ("h1", "put")]


# -- the verify-then-act windows of servers without If-Match, explicitly ---------------------


def _scripted(sim: SimS3, rec: Record, name: str, protocol):
    """Run a claim or refresh protocol and record the entitlement window it yields."""
    sent = sim.now
    token = yield from protocol
    if token is not None:
        rec.windows.append([sim.now, sent + VISIBILITY, name])
    return token


def _plain_put(body: LeaseBody):
    """A lease written as it stands, however it was won."""
    res = yield Put(KEY, body.encode())
    return res.etag


def _stale_lease_then(sim: SimS3, rec: Record, name: str, protocol_after):
    """Write a lease at t=0, then at t=5 (stale: 5 > 3 + 1 s grace) run more."""
    body = LeaseBody.new(name, "m", ORIGIN, VISIBILITY)
    first = yield from _scripted(sim, rec, name, _plain_put(body))
    yield Sleep(5.0 - sim.now)
    return (yield from protocol_after(first))


def test_no_if_match_a_refresh_racing_a_reap_and_a_claim_is_detected():
    """Without If-Match a refresh is HEAD (ours?) then PUT: in between, the janitor can
    reap the stale lease and h1 can check the key (free) and write. h0's PUT lands
    first, h1's 30 ms later. h0 must look again late enough to see h1's write."""
    sim, rec = SimS3(if_none_match=False, if_match=False), Record()
    caps = NEITHER

    def h0_refresh(token):
        body = LeaseBody.new("h0", "m", ORIGIN, VISIBILITY)
        try:
            return (yield from _scripted(sim, rec, "h0",
                                         refresh(KEY, token, body, caps, CSPRNG)))
        except LeaseLostError:
            return "lease lost"

    # h0: PUT at 0; refresh HEAD lands 5.000, its answer takes 40 ms, the PUT 40 ms more.
    h0 = sim.spawn("h0", _stale_lease_then(sim, rec, "h0", h0_refresh),
                   delays=[0.0, (0.0, 0.04), (0.04, 0.0), 0.0])
    # j0 judges the lease stale at 4.99 and its DELETE lands at 5.01.
    sim.spawn("j0", janitor(sim, Janitor((0.0,), ()), caps), start=4.99,
              delays=[0.0, 0.0, (0.02, 0.0)])
    # h1 HEADs at 5.02 (free), its answer and PUT take 45 ms each: the PUT lands 5.11.
    h1 = sim.spawn("h1", _scripted(sim, rec, "h1", claim(
        "csprng_verify", KEY, LeaseBody.new("h1", "m", ORIGIN, VISIBILITY), CSPRNG,
        random.Random(0))), start=5.02, delays=[(0.0, 0.045), (0.045, 0.0), 0.0])
    sim.run()
    assert [(e.actor, e.op, round(e.at, 3)) for e in sim.log] == [
        ("h0", "put", 0.0), ("j0", "delete", 5.01), ("h0", "put", 5.08), ("h1", "put", 5.11)
    ]
    assert h1.value is not None  # h1 holds the lease, rightly: its bytes are stored
    assert h0.value == "lease lost"  # and h0 found out before acting on it


def test_if_none_match_without_if_match_two_janitors_and_a_claim():
    """On a server with If-None-Match but no If-Match on DELETE, a reap is HEAD (still
    the stale version?) then DELETE. Two janitors judge the same stale lease; j1's
    DELETE lands first, h1 creates a fresh lease, then j0's DELETE removes it; h2 creates
    another. h1 must look again late enough to notice."""
    sim, rec = SimS3(if_none_match=True, if_match=False), Record()
    caps = IF_NONE_MATCH_ONLY

    def holder_claim(name):
        body = LeaseBody.new(name, "m", ORIGIN, VISIBILITY)
        return _scripted(sim, rec, name, claim(caps, KEY, body, CSPRNG, random.Random(0)))

    sim.spawn("h0", _scripted(sim, rec, "h0", _plain_put(
        LeaseBody.new("h0", "m", ORIGIN, VISIBILITY))))
    sim.spawn("j0", janitor(sim, Janitor((0.0,), ()), caps), start=5.0,
              delays=[0.0, 0.0, (0.04, 0.0)])
    sim.spawn("j1", janitor(sim, Janitor((0.0,), ()), caps), start=5.0,
              delays=[0.0, 0.0, (0.01, 0.0)])
    h1 = sim.spawn("h1", holder_claim("h1"), start=5.02)
    h2 = sim.spawn("h2", holder_claim("h2"), start=5.05)
    sim.run()
    assert [(e.actor, e.op, round(e.at, 3)) for e in sim.log] == [
        ("h0", "put", 0.0), ("j1", "delete", 5.01), ("h1", "put", 5.02),
        ("j0", "delete", 5.04), ("h2", "put", 5.05),
    ]
    assert h2.value is not None
    assert h1.value is None  # h1's lease was removed under it: it must not believe
