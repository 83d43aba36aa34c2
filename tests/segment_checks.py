"""The checks of the packed-topic simulation (tests/test_segments_sim.py): what must hold
of every message once a world of tests/segment_model.py has run, read from the model's
shared log (deliveries, handler decisions, successful lease writes, hand-out windows)
and the simulated server's log of applied writes."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pawn_queue_sync import layout
from pawn_queue_sync.protocol import segments as seg
from tests.segment_model import MAX_DELIVERY, TOPIC, Log, World, Write, message_id, segment_id
from tests.sim_s3 import SimS3, Version


def _progress(v: Version | None) -> Any:
    return None if v is None else seg.SegmentLease.decode(v.body).progress


def check(w: World, sim: SimS3, log: Log) -> None:
    """Every guarantee, per message (see the module docstring of test_segments_sim)."""
    left = [k for k in sim.objects if k.startswith((layout.segments_prefix(TOPIC),
                                                    layout.segment_leases_prefix(TOPIC)))]
    assert not left, f"left after the clean run: {left}"

    sids = [segment_id(n) for n in range(len(w.segments))]
    counts = dict(zip(sids, w.segments))
    gone_at: dict[str, float] = {}  # segment -> when its DELETE was applied
    gone_index: dict[str, int] = {}  # and where in the server's log
    versions: dict[str, list[tuple[float, int, Version]]] = defaultdict(list)
    for n, e in enumerate(sim.log):
        parsed = layout.parse_segment_key(TOPIC, e.key)
        if parsed and e.op == "delete":
            gone_at.setdefault(parsed[0], e.at)
            gone_index.setdefault(parsed[0], n)
        sid = layout.segment_lease_id(TOPIC, e.key)
        if sid and e.op == "put":
            versions[sid].append((e.at, n, e.after))

    def applied(wr: Write) -> tuple[float, int, Version]:
        """The server's application of a successful write: its version (by token)."""
        found = [v for v in versions[wr.segment] if v[2].etag == wr.token and v[0] <= wr.answered]
        assert found, f"{wr} not in the server's log"
        return found[-1]

    # Entitlement: two holders' hand-out windows on one segment never overlap.
    for sid, windows in log.windows.items():
        ws = [(s, e, c) for s, e, c, _ in windows if s < e]
        for a, (s1, e1, c1) in enumerate(ws):
            for s2, e2, c2 in ws[a + 1:]:
                assert c1 == c2 or max(s1, s2) >= min(e1, e2), (
                    f"{sid}: {c1} may hand out in [{s1:.4f}, {e1:.4f}) and {c2} in "
                    f"[{s2:.4f}, {e2:.4f})")

    # Progress is never lost: what a successful write recorded (settlements, deliveries)
    # is in every later version of the lease while the segment exists.
    settled_at: dict[tuple[str, int], int] = {}  # message -> first recording (log index)
    for wr in log.writes:
        at, n, v = applied(wr)
        p, n_ = _progress(v), counts[wr.segment]
        for later_at, m, later in versions[wr.segment]:
            if m <= n or later_at >= gone_at.get(wr.segment, float("inf")):
                continue
            q = _progress(later)
            for i in range(counts[wr.segment]):
                assert not (_is_settled(p, i, n_) and not _is_settled(q, i, n_)), (
                    f"{wr.segment}[{i}]: settled by {wr.consumer}'s {wr.kind} at {at:.4f}, "
                    f"unsettled in {later.writer}'s version at {later_at:.4f}")
        for i in range(n_):
            if _is_settled(p, i, n_):
                settled_at[wr.segment, i] = min(settled_at.get((wr.segment, i), n), n)

    # A lease is never deleted while its segment exists (its progress would be lost).
    for n, e in enumerate(sim.log):
        sid = layout.segment_lease_id(TOPIC, e.key)
        if sid and e.op == "delete":
            assert gone_index.get(sid, n) < n, (
                f"{e.actor} deleted the lease of {sid} at {e.at:.4f}, its segment still there")

    # An ack batch that deleted a completed segment at once: the DELETE is its record.
    for consumer, sid in log.fast:
        n = gone_index[sid]
        if sim.log[n].actor == consumer:
            for i in range(counts[sid]):
                settled_at[sid, i] = min(settled_at.get((sid, i), n), n)

    by_message: dict[tuple[str, int], list[int]] = defaultdict(list)
    for d, dv in enumerate(log.deliveries):
        by_message[dv.segment, dv.index].append(d)

    # Every hand-out happened inside its holder's window and was recorded first (its
    # version counts at least every delivery so far, across takeovers).
    for msg, ds in by_message.items():
        for k, d in enumerate(ds):
            dv = log.deliveries[d]
            assert any(c == dv.consumer and s <= dv.at <= e and dv.at < fence
                       for s, e, c, fence in log.windows[dv.segment]), f"{dv} outside its window"
            wr = next(x for x in log.writes if x.token == dv.token and x.segment == dv.segment)
            p = _progress(applied(wr)[2])
            assert p.deliveries_of(dv.index) >= k + 1, (
                f"{msg}: delivery {k + 1} recorded as {p.deliveries_of(dv.index)}")
    # ... and every later successful write (any holder's) still counts them: the counts
    # are carried across takeovers (a give-back takes back only undelivered ones).
    for wr in log.writes:
        _, n, v = applied(wr)
        if n > gone_index.get(wr.segment, n):
            continue  # a lease of a gone segment: its messages are settled for good
        p = _progress(v)
        for i in range(counts[wr.segment]):
            before = sum(1 for d in by_message.get((wr.segment, i), [])
                         if log.deliveries[d].pos <= n)
            assert _is_settled(p, i, counts[wr.segment]) or p.deliveries_of(i) >= before, (
                f"{wr.segment}[{i}]: {before} deliveries so far, {p.deliveries_of(i)} "
                f"recorded by {wr.consumer}'s {wr.kind}")

    dead_letters = defaultdict(list)  # message id -> application times of its DL PUTs
    for n, e in enumerate(sim.log):
        if e.op == "put" and e.key.startswith(layout.dead_letter_prefix(TOPIC)):
            dead_letters[e.key].append(n)

    for sid in sids:
        for i in range(counts[sid]):
            msg = (sid, i)
            ds = by_message.get(msg, [])
            # At most max_delivery_count deliveries, across every holder.
            assert len(ds) <= MAX_DELIVERY, f"{msg} delivered {len(ds)} times"
            # Settled in the end, and never delivered after that was recorded.
            assert msg in settled_at, f"{msg} never recorded settled"
            at = settled_at[msg]
            late = [log.deliveries[d] for d in ds if log.deliveries[d].pos > at]
            assert not late, (f"{msg} delivered after its settlement was recorded at "
                              f"{sim.log[at].at:.4f}: {late}")
            # Delivered until settled: the recorded settlement is the decision of the
            # handler of its last delivery, or a dead letter after max_delivery_count.
            decided = [x for x in log.decisions if (x.segment, x.index) == msg and x.pos <= at]
            last = ds[-1] if ds else None
            how = [x for x in decided if x.outcome in ("ack", "nack") and x.delivery == last]
            exhausted = [x for x in decided if x.outcome == "exhausted"
                         and (last is None or x.pos >= log.deliveries[last].pos)]
            assert how or exhausted, (
                f"{msg} settled at {sim.log[at].at:.4f} without a settlement of its last delivery: "
                f"{decided}")
            for x in exhausted:
                assert x.recorded == MAX_DELIVERY, (
                    f"{msg} dead-lettered after {x.recorded} recorded deliveries")
            if not how or how[0].outcome == "nack":
                dl = dead_letters.get(layout.dead_letter_key(TOPIC, message_id(sid, i)), [])
                assert any(n < at for n in dl), f"{msg} settled before its dead letter"
    for x in log.decisions:
        if x.outcome == "exhausted":
            assert x.recorded == MAX_DELIVERY, f"{x}: dead-lettered early"


def _is_settled(p: Any, i: int, count: int) -> bool:
    return i not in p.unsettled(count)
