"""Re-review of packed topics (issue 14), the commits 9c760eb..6d8e675: property
tests of Progress against a naive per-index model, and reproductions of defects
found by reading the code. A defect's test asserts the documented behaviour and is
marked xfail(strict=True) while the defect stands."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.errors import LeaseLostError
from pawn_queue_sync.protocol.segments import Progress
from tests.forking import in_child
from tests.servers import deep_merge
from tests.test_lease_seaweedfs import STRATEGIES
from tests.test_packed_consume import TOPIC, publish_segments

N = 40
index = st.integers(0, N - 1)
ops = st.lists(
    st.tuples(st.sampled_from(["hand", "settle", "release"]), st.lists(index, max_size=8)),
    max_size=25,
)


def run_model(steps: list[tuple[str, list[int]]], max_delivery: int
              ) -> tuple[Progress, dict[int, int], set[int]]:
    """Apply ``steps`` to a Progress and to a per-index model, checking hand_out's
    answers on the way; both results."""
    p = Progress(count=N)
    deliveries: dict[int, int] = {}
    settled: set[int] = set()
    for op, idx in steps:
        if op == "hand":
            p, handed, exhausted = p.hand_out(idx, max_delivery)
            want_h, want_e = [], []
            for i in dict.fromkeys(idx):
                if i in settled:
                    continue
                (want_e if deliveries.get(i, 0) >= max_delivery else want_h).append(i)
            assert (handed, exhausted) == (want_h, want_e)
            for i in want_h:
                deliveries[i] = deliveries.get(i, 0) + 1
        elif op == "settle":
            p = p.settle(idx)
            settled |= set(idx)
        else:
            p = p.release(idx)
            for i in set(idx):
                deliveries[i] = max(deliveries.get(i, 0) - 1, 0)
    return p, deliveries, settled


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(1, 4), st.integers(0, N + 5), st.one_of(st.none(), st.integers(0, N + 5)))
def test_progress_matches_a_per_index_model(
    steps: list[tuple[str, list[int]]], max_delivery: int, count: int, limit: int | None
) -> None:
    p, deliveries, settled = run_model(steps, max_delivery)
    for q in (p, Progress.from_json(json.loads(json.dumps(p.to_json())))):
        assert all(q.deliveries_of(i) == deliveries.get(i, 0) for i in range(N + 5))
        assert all(q.is_settled(i) == (i in settled) for i in range(N + 5))
        naive = [i for i in range(count) if i not in settled]
        assert q.unsettled(count) == naive
        assert q.unsettled(count, limit=limit) == naive[:limit]
        assert q.settled_count(count) == len([i for i in settled if i < count])
        assert q.with_count(count).complete == (not naive)
        assert q.with_count(count).unsettled() == naive


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 10)), max_size=12),
       st.lists(st.tuples(st.integers(0, 30), st.integers(1, 10), st.integers(1, 3)),
                max_size=12))
def test_overlapping_runs_decode_as_their_union_and_sum(
    settled: list[tuple[int, int]], deliveries: list[tuple[int, int, int]]
) -> None:
    """A lease written by another client may hold overlapping or unmerged runs."""
    doc = {"count": 50, "settled": [[a, a + w] for a, w in settled],
           "deliveries": [[a, a + w, n] for a, w, n in deliveries]}
    p = Progress.from_json(doc)
    for i in range(50):
        assert p.is_settled(i) == any(a <= i < a + w for a, w in settled)
        assert p.deliveries_of(i) == sum(n for a, w, n in deliveries if a <= i < a + w)
    assert p.settled_count(50) == sum(p.is_settled(i) for i in range(50))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_forked_childs_ack_of_a_pre_fork_message_keeps_the_parents_lease(
    real_s3_config: dict[str, Any], strategy: str
) -> None:
    """A forked child's copy of a held segment wrote the lease with the parent's token
    when it settled a pre-fork message: the lease's ETag changed under the parent,
    whose next settlement then failed with LeaseLostError (every message of the
    segment it still had out lost and redelivered later). Now the segment is the
    parent's alone (docs/guarantees.md): the child's settlement raises LeaseLostError
    and writes nothing, and the parent settles all four."""
    config = deep_merge(real_s3_config, {**STRATEGIES[strategy],
                                         "polling": {"interval_seconds": 0.1}})
    with PawnQueue.from_config(config) as pq:
        pq.create_topic(TOPIC, packed=True)
        publish_segments(pq, list(range(4)), 4)
        c = pq.register_consumer("c", [TOPIC])
        msgs = c.poll(4)
        assert [m.payload for m in msgs] == [0, 1, 2, 3]

        def child() -> int:
            try:
                c.ack(msgs[0])  # a pre-fork message: the parent's segment, not ours
            except LeaseLostError:
                return 0
            return 1

        assert in_child(child) == 0
        for m in msgs:  # the parent's lease is untouched: it settles every one
            c.ack(m)
        assert pq.topic_stats(TOPIC)["segments"] == 0
