"""claim_csprng_batch on the simulated S3 (no If-None-Match), with hypothesis.

Batch claimers (a poll: LIST the leases, reap stale ones, some client time, then one
batch claim of the keys found free), single-key claimers (claim_csprng, as older
consumers run it) and janitors (LIST, reap stale leases) share a few lease keys, some
of which start with a stale lease. The bound of docs/guarantees.md: every one-way
delay below ``jitter_min_ms``. Within it, for every key, the believers are exactly the
writer of the version stored at the end (none if that is the stale one): never two,
and nobody overwrites or removes a lease once its claimer believes.

A listing older than jitter_min (from its request) is not trusted: the key gets a
HEAD. Trusting it any longer breaks the guarantee within the delay bound
(``TRUSTED_TOO_LONG``).
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import attrs
import pytest
from hypothesis import HealthCheck, Phase, example, find, given, settings
from hypothesis import strategies as st

from pawn_queue_sync.clock import SystemClock
from pawn_queue_sync.encoding import md5_hex
from pawn_queue_sync.errors import DeadlineExceeded
from pawn_queue_sync.protocol.effects import Head, List, Now, Parallel, Put, Sleep, run
from pawn_queue_sync.protocol.lease import (
    Capabilities,
    CsprngSettings,
    KeyRange,
    LeaseBody,
    claim_csprng,
    claim_csprng_batch,
    is_stale,
    reap,
)
from pawn_queue_sync.storage.memory import MemoryStore
from tests.sim_s3 import ORIGIN, SimS3, Version
from tests.test_protocol_csprng import FAST

PREFIX = "orders/leases/"
KEYS = tuple(f"{PREFIX}m{i}.lease" for i in range(3))
VISIBILITY = 30.0
#: A lease written this long before the run starts is stale for all of it.
STALE_AT = -100.0


@attrs.frozen
class Batch:
    start_us: int
    gap_us: int  # client time between the lease listing's answer and the batch claim
    keys: tuple[str, ...]
    delays_us: tuple[tuple[int, int], ...]
    seed: int
    #: PUTs sent this many at a time (None: all at once), and re-listing before a group
    #: once the listing is older than this many microseconds (None: never), as the
    #: consumer does with its claim pool
    group: int | None = None
    relist_us: int | None = None
    #: range listings sized to our keys alone, so any other key in the range makes
    #: them page on (KeyRange's estimate at its tightest)
    tight: bool = False


@attrs.frozen
class Single:
    start_us: int
    key: str
    delays_us: tuple[tuple[int, int], ...]
    seed: int


@attrs.frozen
class Janitor:
    start_us: int
    delays_us: tuple[tuple[int, int], ...]


@attrs.frozen
class World:
    settings: CsprngSettings
    if_match: bool
    stale: tuple[str, ...]  # keys holding a stale lease at the start
    batches: tuple[Batch, ...]
    singles: tuple[Single, ...] = ()
    janitors: tuple[Janitor, ...] = ()
    #: How long a listing is trusted (seconds); None: the protocol's own bound.
    fresh_for: float | None = None
    #: The server's ETags are not the MD5 of the bytes (see SimS3)
    opaque_etags: bool = False


@st.composite
def worlds(draw, resends: bool = False):
    """1-4 batch claimers, 0-4 single-key claimers, 0-2 janitors, every one-way delay
    below jitter_min_ms, gaps on both sides of the listing's freshness; with
    ``resends``, requests may also be retried by the S3 layer (tests.sim_s3) up to
    about two claims' length after they were made."""
    jmin = draw(st.integers(5, 100))
    cfg = CsprngSettings(
        jitter_min_ms=jmin,
        jitter_max_ms=draw(st.one_of(st.just(jmin), st.integers(jmin, jmin + 200))),
        verify_retries=draw(st.integers(0, 3)),
        verify_retry_delay_ms=draw(st.integers(0, 100)),
    )
    top = jmin * 1000 - 1
    delay = st.one_of(st.sampled_from([0, top]), st.integers(0, top))
    request = st.tuples(delay, delay)
    if resends:
        resend = st.integers(0, 4 * (cfg.jitter_max_ms + jmin) * 1000)
        request = st.tuples(delay, delay, st.one_of(st.just(0), resend))
    delays = st.lists(request, min_size=1, max_size=16).map(tuple)
    start = st.one_of(st.just(0), st.integers(0, 2 * (cfg.jitter_max_ms + jmin) * 1000))
    gap = st.one_of(st.sampled_from([0, jmin * 1000, jmin * 1000 + 1]),
                    st.integers(0, 3 * jmin * 1000))
    keys = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True).map(tuple)
    return World(
        cfg,
        draw(st.booleans()),
        tuple(draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))),
        tuple(draw(st.lists(st.builds(Batch, start, gap, keys, delays, st.integers(0, 2**32),
                                      st.one_of(st.none(), st.integers(1, 2)),
                                      st.one_of(st.none(), st.integers(0, jmin * 1000)),
                                      st.booleans()),
                            min_size=1, max_size=4))),
        tuple(draw(st.lists(st.builds(Single, start, st.sampled_from(KEYS), delays,
                                      st.integers(0, 2**32)), max_size=4))),
        tuple(draw(st.lists(st.builds(Janitor, start, delays), max_size=2))),
    )


def judge(caps: Capabilities, settings: CsprngSettings | None = None):
    """What a poll does first (queue.reaping.live_leases): LIST the leases, reap the stale
    ones if unchanged; returns the keys still held."""
    listing = yield List(PREFIX)
    held = set()
    for info in listing.objects:
        if is_stale(info.last_modified, listing.server_time, VISIBILITY) and (
            yield from _reaped(info.key, info.etag, caps, settings)
        ):
            continue
        held.add(info.key)
    return held


def _reaped(key: str, etag: str, caps: Capabilities, settings: CsprngSettings | None):
    """reap(); one whose DELETE could not be retried in time counts as not reaped (as
    queue.reaping does with any store error: the lease stays for a later pass)."""
    try:
        return (yield from reap(key, etag, caps, settings))
    except DeadlineExceeded:
        return False


def batch_claimer(name: str, b: Batch, w: World, caps: Capabilities):
    """A consumer's poll on csprng_verify: list (when sent: the freshness origin),
    judge, some client time, then one batch claim of the keys found free."""
    listed_at = yield Now()
    held = yield from judge(caps, w.settings)
    yield Sleep(b.gap_us / 1e6)
    claims = [(k, LeaseBody.new(name, k, ORIGIN, VISIBILITY)) for k in b.keys if k not in held]
    tokens = yield from claim_csprng_batch(
        PREFIX, claims, listed_at, w.settings, random.Random(b.seed), fresh_for=w.fresh_for,
        group=b.group, relist_after=None if b.relist_us is None else b.relist_us / 1e6,
        ranges=KeyRange(PREFIX, crowd=0.0, slack=0) if b.tight else None,
    )
    return {key: token for (key, _), token in zip(claims, tokens) if token is not None}


def single_claimer(name: str, s: Single, w: World):
    body = LeaseBody.new(name, s.key, ORIGIN, VISIBILITY)
    token = yield from claim_csprng(s.key, body, w.settings, random.Random(s.seed))
    return {} if token is None else {s.key: token}


def us(delays_us):
    return [tuple(d / 1e6 for d in delays) for delays in delays_us]


def run_world(
    w: World, honour_retry_by: bool = True
) -> tuple[SimS3, dict[str, dict[str, str]]]:
    """Run everyone; returns the server and {key: {believer: token}}."""
    sim = SimS3(if_none_match=False, if_match=w.if_match, opaque_etags=w.opaque_etags,
                honour_retry_by=honour_retry_by)
    caps = Capabilities(if_none_match=False, if_match=w.if_match)
    for key in w.stale:
        body = LeaseBody.new("old", key, ORIGIN, VISIBILITY).encode()
        sim.objects[key] = Version(body, md5_hex(body), STALE_AT, "old")
    for i, b in enumerate(w.batches):
        sim.spawn(f"b{i}", batch_claimer(f"b{i}", b, w, caps), start=b.start_us / 1e6,
                  delays=us(b.delays_us))
    for i, s in enumerate(w.singles):
        sim.spawn(f"s{i}", single_claimer(f"s{i}", s, w), start=s.start_us / 1e6,
                  delays=us(s.delays_us))
    for i, j in enumerate(w.janitors):
        sim.spawn(f"j{i}", judge(caps, w.settings), start=j.start_us / 1e6, delays=us(j.delays_us))
    believers: dict[str, dict[str, str]] = {key: {} for key in KEYS}
    for name, out in sim.run().items():
        assert out.done, name
        if out.error is not None:  # a single claimer whose lease write never landed
            assert isinstance(out.error, DeadlineExceeded) and name.startswith("s"), (
                name, out.error)
            assert all(e.actor != name for e in sim.log), (name, out.error)
            continue
        if not name.startswith("j"):
            for key, token in out.value.items():
                believers[key][name] = token
    return sim, believers


def check(w: World) -> SimS3:
    """For every key: the believers are exactly the writer of the stored version."""
    sim, believers = run_world(w)
    for key in KEYS:
        stored = sim.objects.get(key)
        expected = {} if stored is None or stored.writer == "old" else {
            stored.writer: stored.etag
        }
        assert believers[key] == expected, (key, believers[key], stored)
    return sim


S = CsprngSettings(jitter_min_ms=5, jitter_max_ms=5, verify_retries=0, verify_retry_delay_ms=0)
#: Within the bound, at its edge: b0's listing is trusted for exactly jitter_min and its
#: PUT takes just under jitter_min, landing just before s0's final check.
EDGE = World(S, False, (),
             (Batch(0, 5_000, (KEYS[0],), ((0, 0), (4_999, 0)), 0),),
             (Single(0, KEYS[0], ((0, 0),), 0),))


@settings(FAST, max_examples=150)
@example(EDGE)
@given(worlds())
def test_within_the_bound_the_only_believer_of_a_key_is_its_stored_writer(w):
    check(w)


#: b0 lists at t=0 (the key is free) and PUTs at once; that attempt is lost and the S3
#: layer retries 30 ms later. s0 claims the key from 1 ms and has confirmed by 11 ms.
RETRIED = World(S, False, (),
                (Batch(0, 0, (KEYS[0],), ((0, 0), (0, 0, 30_000), (0, 0)), 0),),
                (Single(1_000, KEYS[0], ((0, 0),), 0),))


@settings(FAST, max_examples=150)
@example(RETRIED)
@given(worlds(resends=True))
def test_retried_requests_never_make_a_second_believer(w):
    """The same, with any request retried by the S3 layer at any time (a reset, a 503):
    the retry bound of lease writes and deletes keeps it (the chaos suite's miss)."""
    check(w)


def test_without_the_retry_bound_the_retried_batch_write_takes_a_verified_lease():
    """RETRIED when the client retries whenever: b0's retry lands on s0's confirmed
    lease and both believe; with the bound (the example above) only s0 does."""
    sim, believers = run_world(RETRIED, honour_retry_by=False)
    assert sorted(believers[KEYS[0]]) == ["b0", "s0"]
    overwrite = sim.log[-1]
    assert (overwrite.actor, overwrite.before.writer) == ("b0", "s0")
    assert overwrite.at > sim.outcomes["s0"].finished_at
    sim, believers = run_world(RETRIED)
    assert list(believers[KEYS[0]]) == ["s0"]
    assert [e.actor for e in sim.log] == ["s0"]


def test_hypothesis_finds_a_batch_duplicate_from_retries_without_the_bound():
    found = find(
        worlds(resends=True),
        lambda w: any(len(b) >= 2 for b in run_world(w, honour_retry_by=False)[1].values()),
        settings=settings(max_examples=1000, derandomize=True, database=None, deadline=None,
                          phases=[Phase.generate], suppress_health_check=list(HealthCheck)),
    )
    check(found)  # the same world is safe with the bound


def test_the_edge_example_raced():
    """EDGE is a real race: b0's write lands last, s0 sees it and backs off."""
    sim, believers = run_world(EDGE)
    assert [(e.actor, round(e.at, 6)) for e in sim.log] == [("s0", 0.0), ("b0", 0.009999)]
    assert list(believers[KEYS[0]]) == ["b0"]


# -- the freshness of the listing -------------------------------------------------------


def _recorded(log: list, delays: list[tuple[float, float]]):
    """A delay function that also records each request's effect type."""

    def delay(i: int, effect) -> tuple[float, float]:
        log.append(type(effect).__name__)
        return delays[min(i, len(delays) - 1)]

    return delay


@pytest.mark.parametrize("gap_ms, heads", [(4.0, 0), (6.0, 1)])
def test_a_listing_older_than_jitter_min_falls_back_to_a_head(gap_ms, heads):
    """b0 lists at t=0 (the key is free); s0 takes the key at 1 ms. If b0 claims 4 ms
    after its listing, it trusts it and writes: its PUT lands before s0 verifies, so s0
    backs off and b0 wins. At 6 ms the listing is too old: b0 HEADs the key, finds
    s0's lease and writes nothing."""
    sent: list[str] = []
    w = World(S, False, (), (Batch(0, int(gap_ms * 1000), (KEYS[0],), (), 7),))
    sim = SimS3(if_none_match=False, if_match=False)
    caps = Capabilities(False, False)
    b0 = sim.spawn("b0", batch_claimer("b0", w.batches[0], w, caps),
                   delays=_recorded(sent, [(0.0, 0.0)]))
    s0 = sim.spawn("s0", single_claimer("s0", Single(0, KEYS[0], (), 1), w), start=0.001)
    sim.run()
    assert sent.count("Head") == heads
    if heads:
        assert sent == ["List", "Head"]  # no PUT, no verification
        assert (b0.value, list(s0.value)) == ({}, [KEYS[0]])
        assert [e.actor for e in sim.log] == ["s0"]
    else:
        assert sent == ["List", "Put", "List", "List"]
        assert (list(b0.value), s0.value) == ([KEYS[0]], {})
        assert [e.actor for e in sim.log] == ["s0", "b0"]


def test_groups_relist_once_instead_of_a_head_per_key_and_give_up_what_is_taken():
    """b0 claims three keys one at a time (a pool of one thread), each PUT taking 3 ms,
    re-listing once its listing is older than 2.5 ms. s0 takes the third key at 1 ms.
    Before the second PUT b0 re-lists (one LIST, not a HEAD); before the third it
    re-lists again, sees s0's lease and gives that key up without a request for it."""
    sent: list[str] = []
    w = World(S, False, (), (Batch(0, 0, KEYS, (), 7, group=1, relist_us=2_500),))
    sim = SimS3(if_none_match=False, if_match=False)
    caps = Capabilities(False, False)
    b0 = sim.spawn("b0", batch_claimer("b0", w.batches[0], w, caps),
                   delays=_recorded(sent, [(0.0, 0.0), (0.0015, 0.0015)]))
    s0 = sim.spawn("s0", single_claimer("s0", Single(0, KEYS[2], (), 1), w), start=0.001)
    sim.run()
    assert "Head" not in sent
    assert sent[:5] == ["List", "Put", "List", "Put", "List"]  # no third PUT
    assert sorted(b0.value) == [KEYS[0], KEYS[1]]
    assert list(s0.value) == [KEYS[2]]
    assert [e.actor for e in sim.log].count("b0") == 2


#: The listing trusted 2 us longer than jitter_min: b0 lists at t=0 (free), s0 claims
#: at t=0 and has confirmed by t=10 ms; b0 still trusts its listing at 5.002 ms, and its
#: PUT (4.999 ms on the way, within the delay bound) lands at 10.001 ms.
TRUSTED_TOO_LONG = World(S, False, (),
                         (Batch(0, 5_002, (KEYS[0],), ((0, 0), (4_999, 0)), 0),),
                         (Single(0, KEYS[0], ((0, 0),), 0),), fresh_for=0.005002)


def test_trusting_a_listing_longer_than_jitter_min_gives_two_believers():
    """The freshness bound is tight: every one-way delay is below jitter_min, yet b0's
    check (the listing, at 0) and its PUT (10.001 ms) are more than 2 x jitter_min
    apart, so its PUT overwrites s0's confirmed lease and both believe."""
    sim, believers = run_world(TRUSTED_TOO_LONG)
    assert sorted(believers[KEYS[0]]) == ["b0", "s0"]  # the duplicate
    overwrite = sim.log[-1]
    assert (overwrite.actor, overwrite.before.writer) == ("b0", "s0")
    assert overwrite.at > sim.outcomes["s0"].finished_at == pytest.approx(0.010)


def test_with_the_derived_bound_the_same_schedule_heads_and_is_safe():
    sim, believers = run_world(attrs.evolve(TRUSTED_TOO_LONG, fresh_for=None))
    assert believers[KEYS[0]] == {"s0": sim.objects[KEYS[0]].etag}
    assert [e.actor for e in sim.log] == ["s0"]


def test_a_round_drops_only_the_keys_overwritten():
    """b0 claims three keys; s0 overwrites one of them during b0's jitter: b0 keeps the
    other two, and the listing rounds never give the lost one back."""
    slow = CsprngSettings(jitter_min_ms=5, jitter_max_ms=5, verify_retries=2,
                          verify_retry_delay_ms=3)
    w = World(slow, True, (), (Batch(0, 0, KEYS, ((0, 0),), 0),))
    sim = SimS3(if_none_match=False, if_match=True)
    b0 = sim.spawn("b0", batch_claimer("b0", w.batches[0], w, Capabilities(False, True)))
    body = LeaseBody.new("s0", KEYS[1], ORIGIN, VISIBILITY).encode()
    sim.spawn("s0", _one(Put(KEYS[1], body)), start=0.002)
    sim.run()
    assert sorted(b0.value) == [KEYS[0], KEYS[2]]
    assert b0.requests == 1 + 3 + 3 + 1  # LIST, 3 PUTs, 3 rounds, the final round


# -- the real runner ------------------------------------------------------------------------


class _Gate(MemoryStore):
    """A MemoryStore whose PUTs wait at a barrier: they pass only if all run at once."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=10)

    def put(self, key, body, **kw):
        self.barrier.wait()
        return super().put(key, body, **kw)


def test_run_performs_parallel_branches_on_the_pool_concurrently():
    store = _Gate(3)
    claims = [(k, LeaseBody.new("c", k, ORIGIN, VISIBILITY)) for k in KEYS]
    fast = CsprngSettings(jitter_min_ms=0, jitter_max_ms=0, verify_retries=0,
                          verify_retry_delay_ms=0)
    clock = SystemClock()
    with ThreadPoolExecutor(3) as pool:
        tokens = run(claim_csprng_batch(PREFIX, claims, clock.monotonic() + 60, fast),
                     store, clock, pool)
    assert tokens == [body.token for _, body in claims]
    assert {o.key: o.etag for o in store.list(PREFIX).objects} == dict(zip(KEYS, tokens))


def test_run_raises_a_branch_error_after_the_others_finish():
    store = MemoryStore()

    def missing():
        yield Head("nothing")

    def write():
        yield Put("k", b"v")

    with ThreadPoolExecutor(2) as pool, pytest.raises(LookupError):
        run(_one(Parallel((missing(), write()))), store, SystemClock(), pool)
    assert store.head("k").etag == md5_hex(b"v")


def _one(effect):
    """A protocol of one effect."""
    return (yield effect)


# -- range listings -------------------------------------------------------------------------


class _Counting(MemoryStore):
    """A MemoryStore that records what each LIST asked for and how many keys it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.lists: list[tuple[str | None, int | None, int]] = []

    def list(self, prefix, *, limit=None, delimiter=None, start_after=None):
        got = super().list(prefix, limit=limit, delimiter=delimiter, start_after=start_after)
        self.lists.append((start_after, limit, len(got.objects)))
        return got


def _leases(store: MemoryStore, names) -> list[str]:
    keys = [f"{PREFIX}{name}.lease" for name in names]
    for key in keys:
        store.put(key, b"other")
    return keys


def test_a_range_listing_pages_on_until_it_passes_the_last_key():
    """Others' keys crowd the range far beyond the estimate: the lister pages on from the
    last key it saw, finds every key of the range, and learns how crowded it was."""
    store = _Counting()
    _leases(store, (f"{i:03d}" for i in range(0, 1000, 2)))  # others: even numbers
    ours = _leases(store, (f"{i:03d}" for i in range(101, 200, 10)))  # 10 of ours
    ranges = KeyRange(PREFIX, crowd=0.0, slack=0)
    etags = run(ranges.etags(ours), store, SystemClock())
    assert set(ours) <= set(etags)
    assert all(start > f"{PREFIX}1" for start, _, _ in store.lists[1:])
    assert len(store.lists) > 1
    assert sum(n for _, _, n in store.lists) < 200  # never the 500 keys past the range
    assert ranges.crowd == pytest.approx(len([k for k in etags if ours[0] <= k <= ours[-1]])
                                         / len(ours) - 1)
    store.lists.clear()
    again = run(ranges.etags(ours), store, SystemClock())  # sized by what it learned
    assert again == etags
    assert len(store.lists) == 1


def test_a_batch_claim_lists_only_the_range_of_its_keys():
    """Verification rounds of ten adjacent claims among 600 others' leases list the
    claims' range, not the prefix; the claims are won and the others untouched."""
    store = _Counting()
    others = _leases(store, (f"a{i:03d}" for i in range(300)))
    others += _leases(store, (f"c{i:03d}" for i in range(300)))
    claims = [(f"{PREFIX}b{i}.lease", LeaseBody.new("c", f"b{i}", ORIGIN, VISIBILITY))
              for i in range(10)]
    fast = CsprngSettings(jitter_min_ms=0, jitter_max_ms=0, verify_retries=2,
                          verify_retry_delay_ms=0)
    clock = SystemClock()
    tokens = run(claim_csprng_batch(PREFIX, claims, clock.monotonic() + 60, fast),
                 store, clock)
    assert all(tokens)
    assert len(store.lists) == 4  # three rounds and the final one
    assert all(start == f"{PREFIX}b0.leas" for start, _, _ in store.lists)
    # the first sized by a guess (as many others as ours), then by what it found
    assert [limit for _, limit, _ in store.lists] == [10 + 10 + 16] + [10 + 16] * 3
    assert all(store.get(key).body == b"other" for key in others)


def test_on_written_gets_the_keys_written_before_verification_begins():
    """The hook hears of the leases written (not the keys given up as taken) before the
    jitter, so the caller may read their messages while verification waits."""
    sent: list[str] = []
    heard: list[tuple[list[str], int]] = []
    sim = SimS3(if_none_match=False, if_match=False)
    taken = LeaseBody.new("other", KEYS[1], ORIGIN, VISIBILITY).encode()
    sim.objects[KEYS[1]] = Version(taken, md5_hex(taken), 0.0, "other")
    claims = [(k, LeaseBody.new("b0", k, ORIGIN, VISIBILITY)) for k in KEYS]

    def claimer():
        listed_at = yield Now()
        yield List(PREFIX)
        return (yield from claim_csprng_batch(
            PREFIX, claims, listed_at, S, random.Random(1), group=1, relist_after=0.0,
            on_written=lambda keys: heard.append((keys, len(sent))),
        ))

    b0 = sim.spawn("b0", claimer(), delays=_recorded(sent, [(0.0005, 0.0005)]))
    sim.run()
    assert b0.value[1] is None and all(b0.value[::2])
    [(keys, at)] = heard
    assert keys == [KEYS[0], KEYS[2]]
    assert sent[at - 1] == "Put" and "Put" not in sent[at:]
    assert sent[at:] == ["List", "List"]  # verification after it: a round, the final one
