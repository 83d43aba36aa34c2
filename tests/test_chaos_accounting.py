"""The chaos suite's accounting on hand-made event lists (no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from benchmarks.chaos.accounting import Counts, count, deliveries, explain_overlaps
from benchmarks.chaos.goals import judge
from benchmarks.chaos.ledger import Ledger, LedgerTail, read_events

VT = 10.0


def pub(mid: str, t: float = 0.0) -> dict[str, Any]:
    return {"e": "pub", "id": mid, "t": t}


def delivery(mid: str, start: float, end: float | None, *, w: float | None = None,
             outcome: str = "ok", pid: int = 1, d: str | None = None) -> list[dict[str, Any]]:
    """A start event and (unless the process died: end None) its end event."""
    token = d or f"{mid}@{start}"
    events = [{"e": "start", "id": mid, "t": start, "pid": pid, "d": token,
               "w": start if w is None else w}]
    if end is not None:
        events.append({"e": "end", "id": mid, "t": end, "pid": pid, "d": token,
                       "w": start if w is None else w, "outcome": outcome})
    return events


def counted(events: list[dict[str, Any]], **kw: Any) -> Counts:
    kw.setdefault("dead_letters", set())
    kw.setdefault("swept", set())
    kw.setdefault("remaining", 0)
    return count(events, visibility_timeout=VT, **kw)


def test_a_published_message_never_handled_is_lost() -> None:
    events = [pub("a"), pub("b"), *delivery("a", 1, 2)]
    c = counted(events)
    assert (c.published, c.acked, c.lost) == (2, 1, 1)
    assert c.details["lost"] == ["b"]


def test_a_message_handled_only_with_a_raise_is_lost_unless_dead_lettered_or_swept() -> None:
    events = [pub("a"), pub("b"), pub("c"), *delivery("a", 1, 2, outcome="raised"),
              *delivery("b", 1, 2, outcome="raised"), *delivery("c", 1, 2, outcome="raised")]
    c = counted(events, dead_letters={"b"}, swept={"c"})
    assert (c.acked, c.dead_lettered, c.left, c.lost) == (0, 1, 1, 1)
    assert c.details["lost"] == ["a"]


def test_swept_ids_count_as_left_not_acked() -> None:
    events = [pub("a"), *delivery("a", 1, 2), *delivery("a", 30, 31)]
    c = counted(events, swept={"a"})
    assert (c.acked, c.left, c.lost) == (0, 1, 0)


def test_pubfail_ids_delivered_anyway_are_unconfirmed_and_never_lost() -> None:
    events = [{"e": "pubfail", "id": "x", "t": 0, "error": "PublishError"},
              {"e": "pubfail", "id": "y", "t": 0, "error": "PublishError"},
              *delivery("x", 1, 2)]
    c = counted(events)
    assert (c.published, c.unconfirmed, c.lost) == (0, 1, 0)


def test_duplicates_after_the_lease_expired_are_twice_but_not_while_live() -> None:
    # killed at 1.5 (no end): lease written at 1, live until 1 + 10 - 1.5 = 9.5
    events = [pub("a"), *delivery("a", 1, None), *delivery("a", 12, 13, pid=2)]
    c = counted(events)
    assert (c.delivered_twice, c.twice_while_live, c.lost) == (1, 0, 0)


def test_a_second_start_inside_a_live_lease_is_a_definite_overlap() -> None:
    # the first handler raised at 5: the message was given back then, so live until 5
    events = [pub("a"), *delivery("a", 1, 5, pid=1, outcome="raised"),
              *delivery("a", 3, 4, pid=2)]
    c = counted(events)
    assert (c.delivered_twice, c.twice_while_live) == (1, 1)
    [o] = c.details["overlaps"]
    assert (o["id"], o["first_start"], o["second_start"], o["live_until"]) == ("a", 1, 3, 5)


def test_an_ok_handler_keeps_its_lease_until_the_ack_not_until_its_end() -> None:
    # returned ok at 2 (lease written at 1): live until 1 + 10 - 1.5 = 9.5, not 2
    events = [pub("a"), *delivery("a", 1, 2, pid=1), *delivery("a", 9, 10, pid=2)]
    c = counted(events)
    [o] = c.details["overlaps"]
    assert (c.twice_while_live, o["live_until"]) == (1, 9.5)
    later = [pub("a"), *delivery("a", 1, 2, pid=1), *delivery("a", 9.6, 10, pid=2)]
    assert counted(later).twice_while_live == 0


def test_a_refresh_extends_the_live_window_to_the_last_lease_write() -> None:
    # no end (killed), last write at 20: live until 28.5; a start at 25 overlaps
    start = {"e": "start", "id": "a", "t": 1, "pid": 1, "d": "d1", "w": 1}
    refreshed = {"e": "end", "id": "a", "t": 40, "pid": 1, "d": "d1", "w": 20,
                 "outcome": "ok"}
    c = counted([pub("a"), start, refreshed, *delivery("a", 25, 26, pid=2)])
    assert c.twice_while_live == 1
    c = counted([pub("a"), start, *delivery("a", 25, 26, pid=2)])  # without the refresh
    assert c.twice_while_live == 0


def test_a_start_after_the_earlier_handler_ended_is_not_an_overlap() -> None:
    events = [pub("a"), *delivery("a", 1, 2, outcome="raised"), *delivery("a", 3, 4, pid=2)]
    assert counted(events).twice_while_live == 0


def test_ends_pair_with_their_starts_by_token_then_by_process() -> None:
    events = [
        {"e": "start", "id": "a", "t": 1, "pid": 7, "w": 1},
        {"e": "end", "id": "a", "t": 2, "pid": 7, "w": 1, "outcome": "raised"},
        {"e": "start", "id": "a", "t": 3, "pid": 7, "w": 3},
        {"e": "end", "id": "a", "t": 4, "pid": 7, "w": 3, "outcome": "ok"},
    ]
    [first, second] = deliveries(events)["a"]
    assert (first.end, first.outcome, second.end, second.outcome) == (2, "raised", 4, "ok")


def test_poison_counts_deliveries_and_dead_letters() -> None:
    events = [pub("p1"), pub("p2"), pub("p3"), pub("n")]
    for t in range(5):
        events += delivery("p1", 10 * t, 10 * t + 1, outcome="raised")
    for t in range(4):
        events += delivery("p2", 10 * t, 10 * t + 1, outcome="raised")
    events += delivery("n", 1, 2)
    c = counted(events, dead_letters={"p1", "p2", "n"}, poison={"p1", "p2", "p3"},
                max_delivery_count=5)
    assert (c.wrong_dead_letters, c.poison_delivery_errors, c.poison_not_dead_lettered) == (
        1, 2, 1)
    assert c.details["wrong_dead_letters"] == ["n"]
    assert c.details["poison_delivery_errors"] == {"p2": 4, "p3": 0}
    assert c.delivered_twice == 0  # a poison id's retries are not duplicates


def test_goals_name_each_miss_with_its_figures() -> None:
    events = [pub("a"), pub("b"), *delivery("a", 1, 5), *delivery("a", 2, 3, pid=2)]
    c = counted(events, remaining=3)
    misses = judge(c, events=events, strategy="conditional_write", poison=set(),
                   explained={})
    assert any("1 lost" in m for m in misses), misses
    assert any("3 left" in m for m in misses), misses
    assert any("while a lease was live" in m for m in misses), misses
    clean = counted([pub("a"), *delivery("a", 1, 2)])
    assert judge(clean, events=[], strategy="conditional_write", poison=set(),
                 explained={}) == []


def test_late_acks_other_than_lease_lost_are_misses() -> None:
    c = counted([])
    events = [{"e": "late_ack", "id": "a", "t": 1, "result": "LeaseLostError"},
              {"e": "late_ack", "id": "b", "t": 2, "result": "ok"}]
    misses = judge(c, events=events, strategy="conditional_write", poison=set(),
                   explained={})
    assert misses == ["1 of 2 late acks did not fail with LeaseLostError: ['ok']"]


@attrs.frozen
class Fault:
    t: float
    kind: str
    key: str
    delay_seconds: float


def test_csprng_overlaps_are_explained_only_by_long_enough_delays_on_their_keys() -> None:
    overlaps = [{"id": "a", "first_start": 100.0, "second_start": 105.0},
                {"id": "b", "first_start": 100.0, "second_start": 105.0}]
    faults = [Fault(99.0, "delay_answer", "t/leases/a.lease", 2.0),
              Fault(99.0, "delay_answer", "t/leases/b.lease", 0.05),  # < jitter_min_ms
              Fault(99.0, "error_500", "t/leases/b.lease", 0.0)]
    got = explain_overlaps(overlaps, faults, jitter_min_ms=100)
    assert got == {"explained": {"a": [2.0]}, "unexplained": ["b"]}
    misses = judge(counted([]), events=[], strategy="csprng_verify", poison=set(),
                   explained=got)
    assert len(misses) == 1 and "['b']" in misses[0], misses


def test_a_packed_overlap_is_explained_only_by_a_delay_on_its_own_segment() -> None:
    mine = ["t/segments/s1.seg", "t/segment-leases/s1.lease"]
    events = [pub("m"),
              *({**ev, "keys": mine} if ev["e"] == "start" else ev
                for ev in delivery("m", 100, 103, pid=1, outcome="raised")),
              *({**ev, "keys": mine} if ev["e"] == "start" else ev
                for ev in delivery("m", 101, 102, pid=2))]
    [o] = counted(events).details["overlaps"]
    assert list(o["keys"]) == mine
    other = Fault(99.0, "delay_request", "t/segment-leases/s2.lease", 2.0)
    own = Fault(99.5, "delay_answer", "t/segment-leases/s1.lease", 0.5)
    assert explain_overlaps([o], [other], jitter_min_ms=100)["unexplained"] == ["m"]
    assert explain_overlaps([o], [other, own], jitter_min_ms=100) == {
        "explained": {"m": [0.5]}, "unexplained": []}


def test_the_ledger_skips_a_line_cut_short_and_reads_across_files(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    writer = ledger.writer("a")
    writer.write("pub", id="x", t=2.0)
    writer.write("pub", id="y", t=1.0)
    writer.close()
    (tmp_path / "b-1.jsonl").write_text('{"e":"pub","id":"z","t":1.5}\n{"e":"pub","id')
    assert [ev["id"] for ev in read_events(tmp_path)] == ["y", "z", "x"]
    tail = LedgerTail(tmp_path)
    assert len(tail.new_events()) == 3
    with (tmp_path / "b-1.jsonl").open("a") as f:
        f.write('":"w","t":3}\n')
    assert [ev["id"] for ev in tail.new_events()] == ["w"]


def test_the_table_goes_between_the_markers_and_rows_survive_json(tmp_path: Path) -> None:
    import json

    from benchmarks.chaos.harness import ScenarioResult
    from benchmarks.chaos.report import END, START, load_results, render_table, rewrite_doc

    c = counted([pub("a"), pub("b"), *delivery("a", 1, 2)])
    result = ScenarioResult(scenario=1, name="faults", kind="plain", strategy="csprng_verify",
                            counts=c, notes={"seconds": 3.0, "faults": {"error_500": 2}},
                            goals_met=False, misses=["1 lost"])
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps([result.as_dict()], default=str))
    [loaded] = load_results([saved])
    assert loaded.counts == c and loaded.misses == ["1 lost"]
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{START}\nold table\n{END}\nafter\n")
    rewrite_doc(render_table([loaded], quick=False, seed=0), doc)
    text = doc.read_text()
    assert "old table" not in text and text.startswith("before\n") and text.endswith("after\n")
    [row] = [line for line in text.splitlines() if line.startswith("| 1 faults")]
    assert row.split(" | ")[1:9] == ["csprng_verify", "plain", "2", "1", "0", "0", "1", "0"]
    assert "500 2" in row and "MISSED: 1 lost" in row


def _waiting_run(tmp_path: Path, pending: list[int]) -> Any:
    """A ChaosRun with only what ``wait_handled`` uses: a ledger, settings, and a topic
    whose pending counts are ``pending`` in turn (the last one then)."""
    from benchmarks.chaos.harness import ChaosRun, ChaosSettings

    run = ChaosRun.__new__(ChaosRun)
    run.settings = ChaosSettings(kind="plain", strategy="conditional_write", messages=0,
                                 quick=True)
    run.ledger, run.notes = Ledger(tmp_path), {}
    run.remaining = lambda: pending.pop(0) if len(pending) > 1 else pending[0]
    return run


def test_the_wait_gives_up_when_the_pool_handles_nothing_not_at_a_fixed_time(
        tmp_path: Path) -> None:
    run = _waiting_run(tmp_path, [0])
    assert run.wait_handled(["a"], stall_seconds=0.5) is False
    assert run.notes["stalled_seconds"] == 0.5


def test_the_wait_lasts_until_the_topic_is_drained_not_only_every_id_handled(
        tmp_path: Path) -> None:
    # "a" was handled ok, but its ack was lost: the topic holds it until it comes back
    writer = Ledger(tmp_path).writer("worker")
    writer.write("end", id="a", outcome="ok")
    run = _waiting_run(tmp_path, [1, 1, 0])
    assert run.wait_handled(["a"], stall_seconds=30) is True
    assert run.remaining() == 0 and "stalled_seconds" not in run.notes
    writer.close()
