"""protocol.segments: Progress (pure, compact runs) against a model that keeps one
number per index, SegmentLease's encoding, and the segment lease protocols run on a
MemoryStore (both ways a server may be: with and without If-Match)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.encoding import canonical_json
from pawn_queue_sync.errors import LeaseLostError, SegmentError
from pawn_queue_sync.protocol.effects import run
from pawn_queue_sync.protocol.lease import Capabilities, CsprngSettings
from pawn_queue_sync.protocol.segments import (
    ERROR_CHARS,
    Progress,
    SegmentLease,
    claim_segment,
    finish,
    load,
    record,
    take_over,
)
from pawn_queue_sync.storage.memory import MemoryStore

FAST = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

N = 40  # indexes the model covers
indexes = st.lists(st.integers(0, N - 1), max_size=12)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("hand_out"), indexes, st.integers(1, 4)),
        st.tuples(st.just("settle"), indexes, st.just(0)),
        st.tuples(st.just("release"), indexes, st.just(0)),
        st.tuples(st.just("error"), st.lists(st.integers(0, N - 1), min_size=1, max_size=1),
                  st.integers(0, 3)),
    ),
    max_size=30,
)


class Model:
    """One entry per index: the obvious implementation."""

    def __init__(self) -> None:
        self.deliveries = [0] * N
        self.settled = [False] * N
        self.errors: dict[int, str] = {}

    def apply(self, op: str, idx: list[int], arg: int) -> tuple[list[int], list[int]]:
        handed: list[int] = []
        exhausted: list[int] = []
        for i in dict.fromkeys(idx):
            if op == "hand_out" and not self.settled[i]:
                if self.deliveries[i] >= arg:
                    exhausted.append(i)
                else:
                    self.deliveries[i] += 1
                    handed.append(i)
            elif op == "settle":
                self.settled[i] = True
                self.errors.pop(i, None)
            elif op == "release":
                self.deliveries[i] = max(0, self.deliveries[i] - 1)
            elif op == "error" and not self.settled[i]:
                self.errors[i] = f"e{arg}" * 300
        return handed, exhausted


@FAST
@given(ops, st.integers(0, N))
def test_progress_matches_a_per_index_model(steps, count):
    model = Model()
    progress = Progress(count=count)
    for op, idx, arg in steps:
        want = model.apply(op, idx, arg)
        if op == "hand_out":
            progress, handed, exhausted = progress.hand_out(idx, arg)
            assert (handed, exhausted) == want
        elif op == "settle":
            progress = progress.settle(idx)
        elif op == "release":
            progress = progress.release(idx)
        else:
            progress = progress.with_error(idx[0], f"e{arg}" * 300)
        for i in range(N):
            assert progress.deliveries_of(i) == model.deliveries[i]
            assert progress.is_settled(i) == model.settled[i]
            assert progress.error_of(i) == (model.errors[i][:ERROR_CHARS]
                                            if i in model.errors else None)
        assert progress.unsettled() == [i for i in range(count) if not model.settled[i]]
        assert progress.complete == all(model.settled[:count])
        # compact: runs sorted, disjoint, no two adjacent runs with one value
        for (a, b), (c, _d) in zip(progress.settled, progress.settled[1:]):
            assert a < b < c
        for (a, b, n), (c, _d, m) in zip(progress.deliveries, progress.deliveries[1:]):
            assert a < b <= c and n > 0 and (b < c or n != m)
        # and what a lease carries reads back the same
        assert Progress.from_json(json.loads(canonical_json(progress.to_json()))) == progress


def test_runs_stay_few_for_long_segments():
    """A whole segment settled in order is one range, however many messages."""
    progress = Progress(count=100_000)
    progress, handed, _ = progress.hand_out(range(100_000), 5)
    for start in range(0, 100_000, 1000):
        progress = progress.settle(range(start, start + 1000))
    assert progress.settled == ((0, 100_000),)
    assert progress.deliveries == ((0, 100_000, 1),)
    assert progress.complete and len(handed) == 100_000


@pytest.mark.parametrize("doc, problem", [
    ([], "not a JSON object"),
    ({"count": -1}, "progress.count"),
    ({"count": True}, "progress.count"),
    ({"settled": [[3, 1]]}, "not a valid run"),
    ({"settled": [[0, 1, 2]]}, "not a run of 2"),
    ({"deliveries": [[0, 1]]}, "not a run of 3"),
    ({"deliveries": [[0, 2, 0]]}, "not a valid run"),
    ({"deliveries": "x"}, "must be lists"),
    ({"errors": {"a": "x"}}, "progress.errors"),
    ({"errors": []}, "must be an object"),
])
def test_bad_progress_is_a_segment_error(doc, problem):
    with pytest.raises(SegmentError, match=problem):
        Progress.from_json(doc)


# -- the lease body -----------------------------------------------------------------------


def _lease(clock: FakeClock, consumer: str = "c1", progress: Progress | None = None):
    return SegmentLease.new(consumer, "sid", "t/segments/k-sid-n3.seg", clock.now(), 30.0,
                            progress or Progress(count=3))


def test_a_lease_round_trips_and_carries_pawn_queues_fields():
    clock = FakeClock()
    lease = _lease(clock, progress=Progress(count=3).settle([1]).with_error(0, "boom"))
    doc = json.loads(lease.encode())
    for field in ("consumer_id", "message_id", "claimed_at", "expires_at", "nonce"):
        assert isinstance(doc[field], str)
    assert doc["message_id"] == "sid" == lease.message_id
    assert doc["released"] is False
    assert doc["progress"] == {"count": 3, "settled": [[1, 2]], "deliveries": [],
                               "errors": {"0": "boom"}}
    assert SegmentLease.decode(lease.encode()) == lease
    again = lease.rewritten(clock.now(), 30.0, lease.progress)
    assert again.nonce != lease.nonce and again.encode() != lease.encode()
    taken = lease.rewritten(clock.now(), 30.0, lease.progress, consumer_id="c2")
    assert taken.consumer_id == "c2" and taken.progress == lease.progress


@pytest.mark.parametrize("raw, problem", [
    (b"\xff", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"consumer_id": "c"}', "missing or not text"),
])
def test_bad_lease_is_a_segment_error(raw, problem):
    with pytest.raises(SegmentError, match=problem):
        SegmentLease.decode(raw)


def test_a_lease_with_bad_progress_is_a_segment_error():
    doc = json.loads(_lease(FakeClock()).encode())
    doc["progress"] = {"settled": [["a", 1]]}
    with pytest.raises(SegmentError, match=r"progress\.settled"):
        SegmentLease.decode(json.dumps(doc).encode())
    doc["progress"], doc["released"] = {}, "yes"
    with pytest.raises(SegmentError, match="released"):
        SegmentLease.decode(json.dumps(doc).encode())


# -- the protocols on a store ---------------------------------------------------------------

KEY = "t/segment-leases/sid.lease"
SEGMENT = "t/segments/k-sid-n3.seg"
CSPRNG = CsprngSettings(jitter_min_ms=1, jitter_max_ms=2, verify_retries=0,
                        verify_retry_delay_ms=0)


@pytest.fixture(params=[True, False], ids=["if_match", "no_if_match"])
def world(request):
    clock = FakeClock(auto=True)
    caps = Capabilities(if_none_match=request.param, if_match=request.param)
    return MemoryStore(clock), clock, caps


def test_claim_record_take_over_finish(world):
    store, clock, caps = world
    store.put(SEGMENT, b"segment")
    first, _handed, _ = Progress(count=3).hand_out([0, 1], 5)
    mine = _lease(clock, "c1", first)
    token = run(claim_segment(caps, KEY, mine, CSPRNG), store, clock)
    assert token is not None
    # a second claimer of the same segment loses
    assert run(claim_segment(caps, KEY, _lease(clock, "c2"), CSPRNG), store, clock) is None
    mine = mine.rewritten(clock.now(), 30.0, mine.progress.settle([0]))
    token = run(record(caps, KEY, token, mine, CSPRNG), store, clock)
    # c2 finds it (say, stale) and takes it over with the same progress
    seen, etag = run(load(KEY), store, clock)
    assert seen == mine and etag == token
    progress, again, _ = seen.progress.hand_out(seen.progress.unsettled(), 5)
    assert again == [1, 2] and progress.deliveries_of(1) == 2
    theirs = seen.rewritten(clock.now(), 30.0, progress, consumer_id="c2")
    their_token = run(take_over(caps, KEY, etag, theirs, CSPRNG), store, clock)
    assert their_token is not None
    # a second takeover of the version seen fails; so does c1's next record
    late = seen.rewritten(clock.now(), 30.0, progress, consumer_id="c3")
    assert run(take_over(caps, KEY, etag, late, CSPRNG), store, clock) is None
    with pytest.raises(LeaseLostError):
        run(record(caps, KEY, token, mine, CSPRNG), store, clock)
    assert SegmentLease.decode(store.get(KEY).body) == theirs
    # c1's finish (not ours any more) deletes the segment but not c2's lease
    done = theirs.rewritten(clock.now(), 30.0, progress.settle([1, 2]))
    their_token = run(record(caps, KEY, their_token, done, CSPRNG), store, clock)
    assert SegmentLease.decode(store.get(KEY).body).progress.complete
    run(finish(caps, KEY, their_token, SEGMENT), store, clock)
    assert run(load(KEY), store, clock) is None
    assert SEGMENT not in [o.key for o in store.list("t/").objects]


def test_finish_leaves_a_lease_no_longer_ours(world):
    store, clock, caps = world
    store.put(SEGMENT, b"segment")
    lease = _lease(clock)
    token = run(claim_segment(caps, KEY, lease, CSPRNG), store, clock)
    store.put(KEY, _lease(clock, "c2").encode())  # taken over meanwhile
    run(finish(caps, KEY, token, SEGMENT), store, clock)
    assert SegmentLease.decode(store.get(KEY).body).consumer_id == "c2"
