"""The planning of a poll (pawn_queue_sync.queue.planning), without a store: windows,
runs and their cursors, one candidate per id, what a poll remembers."""

from __future__ import annotations

import random
import uuid

from hypothesis import given
from hypothesis import strategies as st

from pawn_queue_sync import layout
from pawn_queue_sync.queue import planning
from pawn_queue_sync.queue.planning import LIST_SLACK, MIN_SHARE, Candidate, TopicState
from pawn_queue_sync.storage.base import DELETE_BATCH, ObjectInfo

TOPIC = "t"

#: 1 to 300 distinct ids, their number spread evenly (runs are capped from 32 on)
ids_st = st.integers(1, 300).flatmap(
    lambda n: st.lists(st.uuids().map(str), min_size=n, max_size=n, unique=True)
)


def candidates_of(ids: list[str]) -> list[Candidate]:
    return [(layout.message_key(TOPIC, "20260101T000000_000000", mid), mid) for mid in ids]


def info(key: str) -> ObjectInfo:
    return ObjectInfo(key=key, etag="e", size=10, last_modified=None)


# -- windows ---------------------------------------------------------------------------------


@given(want=st.integers(1, 2000), held=st.integers(0, 2000))
def test_alone_the_window_is_what_is_wanted(want: int, held: int) -> None:
    assert planning.window(want, held, wide=False) == want


@given(want=st.integers(1, 2000), held=st.integers(0, 2000))
def test_a_wide_window_reaches_at_most_one_page_and_never_below_what_is_wanted(
    want: int, held: int
) -> None:
    wide = planning.window(want, held, wide=True)
    assert wide >= want
    assert wide <= max(want, DELETE_BATCH - held - LIST_SLACK)
    assert wide <= want * planning.CONTENDED_WINDOW


def test_a_wide_window_is_sixteen_times_what_is_wanted_within_a_page() -> None:
    assert planning.window(5, 0, wide=True) == 5 * planning.CONTENDED_WINDOW
    assert planning.window(100, 100, wide=True) == DELETE_BATCH - 100 - LIST_SLACK
    assert planning.listing_limit(80, 3) == 80 + 3 + LIST_SLACK


# -- candidates ----------------------------------------------------------------------------


@given(ids=st.lists(st.sampled_from([str(uuid.UUID(int=i)) for i in range(12)]), max_size=40),
       live_n=st.integers(0, 12), window=st.integers(1, 20), foreign=st.integers(0, 3))
def test_one_candidate_per_id_the_first_listed_none_held_at_most_the_window(
    ids: list[str], live_n: int, window: int, foreign: int
) -> None:
    objects = [info(layout.message_key(TOPIC, f"20260101T000000_{i:06d}", mid))
               for i, mid in enumerate(ids)]
    objects[:0] = [info(f"{TOPIC}/messages/junk-{i}") for i in range(foreign)]
    live = {str(uuid.UUID(int=i)) for i in range(live_n)}
    got, aside = planning.candidates_in(TOPIC, objects, live, window)
    mids = [mid for _, mid in got]
    assert len(mids) == len(set(mids)) <= window
    assert not set(mids) & live
    for key, mid in got:  # the first object listed with that id
        assert key == next(o.key for o in objects if o.key.endswith(f"-{mid}.json"))
    free = list(dict.fromkeys(m for m in ids if m not in live))
    assert mids == free[:window]
    assert [o.key for o in aside] == [f"{TOPIC}/messages/junk-{i}" for i in range(foreign)]


def test_foreign_objects_past_a_full_window_are_left_for_a_later_poll() -> None:
    first = layout.message_key(TOPIC, "20260101T000000_000000", str(uuid.UUID(int=1)))
    objects = [info(first), info(f"{TOPIC}/messages/junk")]
    got, aside = planning.candidates_in(TOPIC, objects, set(), window=1)
    assert [key for key, _ in got] == [first]
    assert aside == []


# -- runs and cursors ----------------------------------------------------------------------


@given(ids=ids_st, want=st.integers(1, 300), peers=st.integers(1, 8), place=st.integers(0, 7),
       cursor=st.none() | st.just("") | st.uuids().map(str))
def test_a_run_is_adjacent_in_id_order_and_never_exceeds_the_share(
    ids: list[str], want: int, peers: int, place: int, cursor: str | None
) -> None:
    place = place % peers
    run, after = planning.run_of(candidates_of(ids), want, cursor, place, peers)
    ordered = sorted(ids)
    mids = [mid for _, mid in run]
    share = max(-(-len(ids) // peers), MIN_SHARE)
    assert 0 < len(mids) <= min(want, share)
    assert len(mids) == min(want, share, len(ids))
    start = ordered.index(mids[0])
    assert mids == ordered[start : start + len(mids)]  # adjacent in id order
    # the cursor: the run's last id, or "" once the run reached the last id
    assert after == ("" if mids[-1] == ordered[-1] else mids[-1])


@given(ids=ids_st, want=st.integers(1, 40))
def test_runs_sweep_every_id_and_wrap_to_the_first(ids: list[str], want: int) -> None:
    candidates = candidates_of(ids)
    ordered = sorted(ids)
    cursor: str | None = None
    seen: list[str] = []
    wrapped = False
    for _ in range(len(ids) + 2):
        run, cursor = planning.run_of(candidates, want, cursor, 0, 1)
        seen.extend(mid for _, mid in run)
        if cursor == "":
            wrapped = True
            break
    assert wrapped
    assert set(seen) == set(ids)
    run, _ = planning.run_of(candidates, want, cursor, 0, 1)
    assert [mid for _, mid in run] == ordered[: len(run)]  # on from the first


@given(peers=st.integers(1, 16), data=st.data())
def test_a_first_run_starts_at_our_place_in_the_id_space(peers: int, data: st.DataObject) -> None:
    place = data.draw(st.integers(0, peers - 1))
    ids = [str(uuid.UUID(int=i * 2**120)) for i in range(256)]
    run, _ = planning.run_of(candidates_of(ids), 4, None, place, peers)
    start = planning.id_at(place / peers)
    later = [mid for mid in ids if mid > start]
    assert [mid for _, mid in run] == (later[:4] if len(later) >= 4 else ids[-4:])


@given(fraction=st.floats(0, 1))
def test_id_at_is_a_uuid_in_order(fraction: float) -> None:
    mid = planning.id_at(fraction)
    assert str(uuid.UUID(mid)) == mid
    assert planning.id_at(0) <= mid <= planning.id_at(1) == str(uuid.UUID(int=2**128 - 1))


# -- choosing and remembering -------------------------------------------------------------


@given(ids=ids_st, want=st.integers(1, 50))
def test_without_runs_want_are_drawn_among_the_candidates(ids: list[str], want: int) -> None:
    state = TopicState()
    candidates = candidates_of(ids)

    def no_peers() -> tuple[int, int]:
        raise AssertionError("the registry is asked only for runs")

    chosen = planning.choose(state, candidates, want, runs=False, peers=no_peers,
                             rng=random.Random(0))
    assert len(chosen) == min(want, len(ids))
    assert len(set(chosen)) == len(chosen) and set(chosen) <= set(candidates)
    assert state.cursor is None


def test_with_runs_the_cursor_is_remembered_for_the_next_poll() -> None:
    state = TopicState()
    ids = sorted(str(uuid.UUID(int=i * 2**120)) for i in range(100))
    candidates = candidates_of(ids)
    first = planning.choose(state, candidates, 5, runs=True, peers=lambda: (0, 1),
                            rng=random.Random(0))
    assert [mid for _, mid in first] == ids[1:6]  # after id_at(0), the all-zero id
    assert state.cursor == ids[5]
    second = planning.choose(state, candidates, 5, runs=True, peers=lambda: (0, 1),
                             rng=random.Random(0))
    assert [mid for _, mid in second] == ids[6:11]


def test_a_poll_remembers_rivals_and_a_lost_claim_moves_the_cursor() -> None:
    state = TopicState()
    assert (state.contended, state.idle, state.cursor, state.leases_seen) == (None, True, None, 0)
    state.listed(3, pending=True)
    assert (state.leases_seen, state.idle) == (3, False)
    state.claimed(rivals=False, got=2, tried=2, rng=random.Random(0))
    assert state.contended is False and state.cursor is None  # no run: no cursor
    state.claimed(rivals=False, got=1, tried=2, rng=random.Random(0))
    assert state.contended is True and state.cursor is None
    state.cursor = "x"
    state.claimed(rivals=True, got=2, tried=2, rng=random.Random(0))
    assert (state.contended, state.cursor) == (True, "x")  # won all: the run goes on
    state.claimed(rivals=False, got=0, tried=2, rng=random.Random(7))
    assert state.cursor == planning.id_at(random.Random(7).random())  # met a rival's run
    state.listed(0, pending=False)
    assert state.idle
