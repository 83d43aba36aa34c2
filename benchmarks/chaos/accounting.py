"""Counting every message of a chaos run by id: pure, from events and bucket facts.

``count`` takes the run's ledger events (:mod:`benchmarks.chaos.ledger`), the ids found
in the topic's dead-letter prefix, the ids the final sweep handled, and what was left
after it, and returns :class:`Counts`. A *delivery* is one handler call: its ``start``
event and, unless its process died, its ``end`` event (paired by the delivery's ``d``
field, else per id and process in order).

A **definite overlap** ("delivered twice while an earlier lease was live"): a later
delivery d2 of an id starts before ``live_until(d1)`` of an earlier one, where
``live_until(d1) = w_last(d1) + visibility_timeout - slack_seconds`` and ``w_last`` is
the latest lease write time d1 reported; if d1's handler raised (the listener gives
the message back: nack or release), its end caps it: ``min(d1's end, ...)``. A handler
that returned ok keeps its lease until the ack deletes the message, so a claim between
its end and that ack took a live lease. d2's claim came before its handler started, so
only certain violations are counted. One exception: a d2 that starts after d1's handler
ended ok with ``delivery_count`` 1 is a new object, not d1's: a publish retried after
its answer was dropped writes an acked message again, fresh (a lease taken from d1,
reaped or stolen after its handler, would carry d1's attempt: a count of 2 or more).

Each delivery's ``start`` event names the keys behind its lease (``keys``: the
message's object and lease keys; on a packed topic also its segment's key and that
segment's lease): under csprng_verify an overlap is explained only by a proxy delay
on one of those keys (:func:`explain_overlaps`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["Counts", "Delivery", "Overlap", "count", "deliveries", "explain_overlaps",
           "overlaps"]

#: Ids listed per kind in ``Counts.details``.
DETAIL_CAP = 20
#: SeaweedFS's LastModified has 1 s granularity: a lease is certainly live only until
#: its write plus the visibility timeout less this.
SLACK_SECONDS = 1.5


@attrs.frozen
class Counts:
    """A run's figures, every message counted by id (see the module docstring)."""

    published: int            # ids with a `pub` event
    unconfirmed: int          # ids with only `pubfail` that were delivered anyway
    acked: int                # published ids handled ok, not dead-lettered nor left to the sweep
    dead_lettered: int        # ids found in {topic}/dead-letter/
    left: int                 # ids the final sweep handled (still there when work stopped)
    lost: int                 # published ids neither acked nor dead-lettered nor left
    delivered_twice: int      # non-poison ids with >= 2 `start` events
    twice_while_live: int     # ids with a definite overlap (any id)
    remaining_after_sweep: int   # messages left after the sweep
    wrong_dead_letters: int   # dead-lettered ids not in the poison set
    poison_delivery_errors: int  # poison ids delivered other than max_delivery_count times
    details: dict[str, Any] = attrs.field(factory=dict, eq=False)
    poison_not_dead_lettered: int = 0   # poison ids not found in dead-letter/

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Delivery:
    """One handler call of one id."""

    id: str
    start: float
    pid: int | None
    w_last: float | None
    end: float | None = None
    outcome: str | None = None
    #: the object keys behind this delivery's lease (see the module docstring)
    keys: tuple[str, ...] = ()
    #: the message's ``delivery_count`` at this delivery (None: not recorded)
    count: int | None = None

    def live_until(self, visibility_timeout: float, slack_seconds: float) -> float:
        """The latest time this delivery's lease was certainly still live: its last
        write plus the visibility timeout (less the slack); if its handler raised, no
        later than the handler's end (the message was given back then). A handler that
        returned ok keeps the lease until its ack."""
        by_lease = (
            math.inf if self.w_last is None
            else self.w_last + visibility_timeout - slack_seconds
        )
        if self.end is not None and self.outcome != "ok":
            return min(self.end, by_lease)
        return by_lease


@attrs.frozen
class Overlap:
    """A later delivery that started while an earlier one's lease was live."""

    id: str
    first_start: float
    live_until: float
    second_start: float
    first_pid: int | None
    second_pid: int | None
    #: the keys behind either delivery's lease (what a csprng delay must have hit)
    keys: tuple[str, ...] = ()


def _max_w(*values: Any) -> float | None:
    found = [float(v) for v in values if isinstance(v, int | float)]
    return max(found) if found else None


def deliveries(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Delivery]]:
    """Each id's deliveries, sorted by start."""
    open_by_d: dict[str, dict[str, Any]] = {}
    open_by_proc: dict[tuple[str, Any], list[dict[str, Any]]] = defaultdict(list)
    done: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in sorted(events, key=lambda ev: ev["t"]):
        kind, mid = ev.get("e"), ev.get("id")
        if mid is None:
            continue
        if kind == "start":
            rec = {"start": ev, "end": None}
            done[mid].append(rec)
            if ev.get("d") is not None:
                open_by_d[ev["d"]] = rec
            else:
                open_by_proc[(mid, ev.get("pid"))].append(rec)
        elif kind == "end":
            rec = open_by_d.pop(ev["d"], None) if ev.get("d") is not None else None
            if rec is None:
                queue = open_by_proc.get((mid, ev.get("pid")))
                rec = queue.pop(0) if queue else None
            if rec is not None:
                rec["end"] = ev
    out: dict[str, list[Delivery]] = {}
    for mid, recs in done.items():
        items = []
        for rec in recs:
            start, end = rec["start"], rec["end"] or {}
            items.append(Delivery(
                id=mid, start=float(start["t"]), pid=start.get("pid"),
                w_last=_max_w(start.get("w"), end.get("w")),
                end=float(end["t"]) if end else None, outcome=end.get("outcome"),
                keys=tuple(str(k) for k in start.get("keys") or ()),
                count=start.get("delivery_count"),
            ))
        out[mid] = sorted(items, key=lambda d: d.start)
    return out


def overlaps(by_id: Mapping[str, Sequence[Delivery]], visibility_timeout: float,
             slack_seconds: float) -> list[Overlap]:
    """Every definite overlap: a delivery that started inside an earlier one's live lease."""
    found: list[Overlap] = []
    for mid, items in by_id.items():
        for i, later in enumerate(items):
            for earlier in items[:i]:
                until = earlier.live_until(visibility_timeout, slack_seconds)
                if _recreated(earlier, later):
                    continue
                if earlier.start <= later.start < until:
                    keys = tuple(dict.fromkeys((*earlier.keys, *later.keys)))
                    found.append(Overlap(mid, earlier.start, until, later.start,
                                         earlier.pid, later.pid, keys))
    return found


def _recreated(earlier: Delivery, later: Delivery) -> bool:
    """Whether ``later`` is a fresh object written after ``earlier`` was handled ok (see
    the module docstring): no lease of ``earlier``'s was taken."""
    return (earlier.outcome == "ok" and earlier.end is not None
            and later.start >= earlier.end and later.count == 1)


def _cap(ids: Iterable[str]) -> list[str]:
    return sorted(ids)[:DETAIL_CAP]


def count(
    events: Iterable[Mapping[str, Any]],
    *,
    dead_letters: set[str],
    swept: set[str],
    remaining: int,
    visibility_timeout: float,
    poison: Iterable[str] = frozenset(),
    max_delivery_count: int | None = None,
    slack_seconds: float = SLACK_SECONDS,
) -> Counts:
    """Count a run (see :class:`Counts`)."""
    events = list(events)
    poison = set(poison)
    published = {ev["id"] for ev in events if ev.get("e") == "pub"}
    failed = {ev["id"] for ev in events if ev.get("e") == "pubfail"} - published
    by_id = deliveries(events)
    ok = {mid for mid, items in by_id.items() if any(d.outcome == "ok" for d in items)}
    unconfirmed = {mid for mid in failed if mid in by_id or mid in dead_letters}
    acked = (published & ok) - dead_letters - swept
    left = published & swept - dead_letters
    lost = published - acked - dead_letters - left
    twice = {mid for mid, items in by_id.items() if len(items) >= 2} - poison
    overlap_list = overlaps(by_id, visibility_timeout, slack_seconds)
    overlapping = {o.id for o in overlap_list}
    wrong = dead_letters - poison
    poison_errors = (
        {mid for mid in poison if len(by_id.get(mid, ())) != max_delivery_count}
        if max_delivery_count is not None else set()
    )
    not_dead = poison - dead_letters
    details: dict[str, Any] = {
        "lost": _cap(lost),
        "delivered_twice": _cap(twice),
        "overlaps": [attrs.asdict(o) for o in overlap_list[:DETAIL_CAP]],
        "wrong_dead_letters": _cap(wrong),
        "poison_delivery_errors": {mid: len(by_id.get(mid, ())) for mid in _cap(poison_errors)},
        "poison_not_dead_lettered": _cap(not_dead),
        "unconfirmed": _cap(unconfirmed),
    }
    return Counts(
        published=len(published), unconfirmed=len(unconfirmed), acked=len(acked),
        dead_lettered=len(dead_letters), left=len(left), lost=len(lost),
        delivered_twice=len(twice), twice_while_live=len(overlapping),
        remaining_after_sweep=remaining, wrong_dead_letters=len(wrong),
        poison_delivery_errors=len(poison_errors), details=details,
        poison_not_dead_lettered=len(not_dead),
    )


def explain_overlaps(overlap_list: Iterable[Mapping[str, Any]], faults: Iterable[Any], *,
                     jitter_min_ms: float, window_seconds: float = 30.0) -> dict[str, Any]:
    """Match each overlap (``attrs.asdict`` of an :class:`Overlap`;
    judge them all, ``Counts.details`` lists only the first DETAIL_CAP) with the proxy's
    delays of at least ``jitter_min_ms`` on that message's own keys between
    ``window_seconds`` before its first delivery and the start of the second.

    The keys are the overlap's ``keys`` (recorded by the handler: the message's object
    and lease keys; packed: its segment's key and that segment's lease); an overlap
    with none recorded matches keys containing its id (a plain message's keys do). A
    delay on another message's or segment's key explains nothing.
    Returns ``{"explained": {id: [delays s]}, "unexplained": [ids]}``."""
    delays = [
        f for f in faults
        if str(getattr(f, "kind", "")).startswith("delay_")
        and float(getattr(f, "delay_seconds", 0.0)) * 1000 >= jitter_min_ms
    ]
    explained: dict[str, list[float]] = {}
    unexplained: list[str] = []
    for o in overlap_list:
        mid, lo, hi = o["id"], o["first_start"] - window_seconds, o["second_start"]
        keys = set(o.get("keys") or ())
        hits = [
            round(float(f.delay_seconds), 3) for f in delays
            if lo <= f.t <= hi and (f.key in keys if keys else mid in f.key)
        ]
        if hits:
            explained[mid] = hits
        else:
            unexplained.append(mid)
    return {"explained": explained, "unexplained": unexplained}
