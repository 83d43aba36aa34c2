"""The chaos ledger's publish records and scenario 2's mid-flight count (no server)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.chaos.ledger import (
    Ledger,
    LedgerTail,
    failed_positions,
    read_events,
    record_publish,
)
from benchmarks.chaos.scenarios.kills import kills_mid_flight, mid_flight_miss
from pawn_queue_sync.errors import PublishError, StorageError


def _publish_error(failed: list[int] | None) -> PublishError:
    err = PublishError("some were not published")
    if failed is not None:
        err.failed_indices = failed  # type: ignore[attr-defined]
    return err


def test_failed_positions_follow_the_documented_failed_indices() -> None:
    """``failed_indices`` lists the payloads NOT published: an empty list means none
    failed; no list (or another error) means any of them may have failed."""
    assert failed_positions(_publish_error([]), 3) == set()
    assert failed_positions(_publish_error([2]), 3) == {2}
    assert failed_positions(_publish_error(None), 3) == {0, 1, 2}
    assert failed_positions(StorageError("down"), 2) == {0, 1}


def test_a_returned_call_is_one_ledger_line_expanded_per_id(tmp_path: Path) -> None:
    """A kill between the lines of one returned call must not leave some of its ids
    unrecorded: the call is one ``pub`` line, which the readers expand."""
    ledger = Ledger(tmp_path)
    out = ledger.writer("producer")
    tail = LedgerTail(tmp_path)
    record_publish(out, ["a", "b", "c"])
    out.close()
    lines = out.path.read_text().splitlines()
    assert len(lines) == 1 and '"ids"' in lines[0]
    for events in (read_events(tmp_path), tail.new_events()):
        assert [(ev["e"], ev["id"]) for ev in events] == [("pub", "a"), ("pub", "b"),
                                                          ("pub", "c")]


def test_a_partly_failed_call_records_published_and_failed_ids(tmp_path: Path) -> None:
    out = Ledger(tmp_path).writer("producer")
    record_publish(out, ["a", "b", "c"], _publish_error([1]))
    record_publish(out, ["d"], StorageError("down"))
    out.close()
    got = [(ev["e"], ev["id"]) for ev in read_events(tmp_path)]
    assert sorted(got) == [("pub", "a"), ("pub", "c"), ("pubfail", "b"), ("pubfail", "d")]
    assert len(out.path.read_text().splitlines()) == 3


def _ev(e: str, t: float, **kw: object) -> dict[str, object]:
    return {"e": e, "t": t, **kw}


def test_kills_mid_flight_counts_kills_that_interrupted_a_handler() -> None:
    events = [
        _ev("start", 1, id="m1", pid=10), _ev("end", 1.1, id="m1", pid=10),
        _ev("start", 1.2, id="m2", pid=10),           # never ends: 10 killed mid-flight
        _ev("kill", 1.3, pid=10),
        _ev("start", 2, id="m3", pid=11), _ev("end", 2.1, id="m3", pid=11),
        _ev("kill", 2.2, pid=11),                      # 11 was idle
        _ev("start", 3, id="m2", pid=12),              # m2 again elsewhere, not killed
        _ev("kill", 3.5, pid=13),                      # a child still starting up
    ]
    assert kills_mid_flight(events) == 1
    assert mid_flight_miss(1, 3, quick=True) == []
    assert mid_flight_miss(1, 3, quick=False)  # wanted 2 of 3
    assert mid_flight_miss(0, 3, quick=True)
    assert mid_flight_miss(10, 20, quick=False) == []


class _FakeProducer:
    """publish_batch that returns (or raises ``error`` after "writing" the batch)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def publish_batch(self, topic: str, payloads: list[dict[str, object]]) -> list[str]:
        if self.error is not None:
            raise self.error
        return [str(p["id"]) for p in payloads]


class _FakeQueue:
    def __init__(self, producer: _FakeProducer) -> None:
        self.producer = producer

    def register_producer(self, name: str) -> _FakeProducer:
        return self.producer


def _run_producer(tmp_path: Path, error: BaseException | None) -> list[str]:
    import random

    from benchmarks.chaos import producer

    out = Ledger(tmp_path).writer("producer")
    producer._batches(_FakeQueue(_FakeProducer(error)), "t", out,  # type: ignore[arg-type]
                      producer.Budget(5), random.Random(0), 5, 5, 0.0)
    out.close()
    return out.path.read_text().splitlines()


def test_the_producer_records_a_returned_batch_in_one_line(tmp_path: Path) -> None:
    """Before: one ``pub`` line per id after the call returned, so a kill among those
    lines turned ids reported published into "killed" pubfails."""
    lines = _run_producer(tmp_path, None)
    assert [line.split(",")[0] for line in lines] == ['{"e":"pubtry"', '{"e":"pub"']
    assert len([ev for ev in read_events(tmp_path) if ev["e"] == "pub"]) == 5


def test_the_producer_reads_an_empty_failed_indices_as_none_failed(tmp_path: Path) -> None:
    """Before: ``failed_indices or range(n)`` made an empty list "all failed"."""
    _run_producer(tmp_path, _publish_error([]))
    assert {ev["e"] for ev in read_events(tmp_path) if ev["e"] != "pubtry"} == {"pub"}


def test_producer_kills_sees_a_batch_line_as_done(tmp_path: Path) -> None:
    """Scenario 5 finds the ids a killed producer was publishing from its own file: ids
    of a ``pub`` {ids} line are done, only ``pubtry`` ids without one are outstanding."""
    from benchmarks.chaos.scenarios.producer_kills import _outstanding

    out = Ledger(tmp_path).writer("producer")
    out.write("pubtry", ids=["a", "b"])
    record_publish(out, ["a", "b"])
    out.write("pubtry", ids=["c"])
    out.close()
    assert _outstanding(out.path) == {"c"}


def test_a_stall_is_shorter_than_the_read_timeout_quick_or_not() -> None:
    """Scenario 1's stalls (delay_request/delay_answer) must not be read timeouts in
    disguise: before, the quick stall (2 s) outlasted the quick read timeout (1.5 s)."""
    from benchmarks.chaos.scenarios.faults import rules
    from benchmarks.chaos.suite import Row, settings_for

    for quick in (True, False):
        settings = settings_for(Row(1, "plain", "conditional_write"), quick=quick)
        delays = [r.delay_seconds for r in rules(settings) if r.kind.startswith("delay_")]
        assert delays and all(0 < d < settings.read_timeout for d in delays), (quick, delays)
