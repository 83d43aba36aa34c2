"""Review 16B (R2) of issue 16's stats and packed redrive: regressions.

- ``exact`` turned False because of the consumer registry (more consumers than
  ``max_keys``), on the first topic of ``stats_all`` only, and the consumers were cut
  at ``max_keys`` with nothing saying so;
- ``pawnq stats --watch`` took any interval above 0 (1e-300: refreshes back to back);
- a packed redrive GET the segment's lease once per letter, not once per segment;
- the registry names cache of the stats kept every key it ever saw.
"""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from pawn_queue_sync import layout
from pawn_queue_sync.cli import stats as cli_stats
from pawn_queue_sync.cli.stats import _watch_seconds
from pawn_queue_sync.queue import topic_stats
from pawn_queue_sync.testing import memory_queue

# -- stats -------------------------------------------------------------------------------


def test_exact_is_about_the_topic_not_the_consumer_registry() -> None:
    """Reproduces: the registry was listed through the topic's bounded reader, so more
    registered consumers than ``max_keys`` set ``exact`` False on the first topic of
    stats_all only, though every count was complete."""
    pq = memory_queue(topics=["a", "b"])
    try:
        producer = pq.register_producer("p")
        for topic in ("a", "b"):
            producer.publish(topic, 1)
        for i in range(3):
            pq.register_consumer(f"c{i}", ["a"])
        found = {s.topic: s for s in pq.stats_all(max_keys=2)}
        assert (found["a"].pending, found["b"].pending) == (1, 1)  # complete counts
        assert [found["a"].exact, found["b"].exact] == [True, True], \
            {t: s.exact for t, s in found.items()}
        one = pq.stats("a", max_keys=2)
        assert one.exact
    finally:
        pq.close()


def test_a_consumer_list_cut_at_max_keys_says_so() -> None:
    """The consumers tuple held the first ``max_keys`` entries with nothing saying it
    was cut: ``consumers_exact`` says it, and a complete list says True."""
    pq = memory_queue(topics=["a"])
    try:
        for i in range(3):
            pq.register_consumer(f"c{i}", ["a"])
        cut = pq.stats("a", max_keys=2)
        assert len(cut.consumers) == 2 and cut.consumers_exact is False
        assert cut.to_dict()["consumers_exact"] is False
        full = pq.stats("a", max_keys=3)
        assert len(full.consumers) == 3 and full.consumers_exact is True
        assert [s.consumers_exact for s in pq.stats_all(max_keys=2)] == [False]
    finally:
        pq.close()


@pytest.mark.parametrize("word", ["1e-300", "0.001", "0.5"])
def test_watch_has_a_floor_like_the_dashboard(word: str) -> None:
    """Reproduces: ``--watch 1e-300`` was taken (refreshes back to back, each a LIST per
    prefix): now refused, naming the minimum."""
    with pytest.raises(argparse.ArgumentTypeError, match="at least"):
        _watch_seconds(None, word)


def test_watch_at_the_floor_is_taken() -> None:
    assert _watch_seconds(None, "1") == (None, 1.0)
    assert getattr(cli_stats, "MIN_WATCH_SECONDS", None) == 1.0
    assert _watch_seconds("t", None) == ("t", None)


def test_pawnq_stats_watch_below_the_floor_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pawn_queue_sync.cli import main

    def never(_args: object) -> None:
        raise AssertionError("the queue was opened: the interval was taken")

    monkeypatch.setattr(cli_stats, "open_queue", never)
    assert main(["stats", "--watch", "0.01"]) == 2
    assert "at least" in capsys.readouterr().err


def test_the_names_cache_keeps_only_the_registry_keys_of_the_last_listing() -> None:
    """The names of registry entries read by stats were kept forever, one per key ever
    seen (pawn-queue's consumers register under random keys): a long-running dashboard
    or metrics process grew without bound. Now only the keys of the last listing."""
    pq = memory_queue(topics=["a"])
    try:
        for i in range(3):
            pq.register_consumer(f"c{i}", ["a"])
        pq.stats("a")
        names = topic_stats._NAMES[pq._ctx]
        assert len(names) == 3
        gone = sorted(o.key for o in pq.store.list("_registry/consumers/").objects)[:2]
        for key in gone:
            pq.store.delete(key)
        assert len(pq.stats("a").consumers) == 1
        assert set(topic_stats._NAMES[pq._ctx]) == set(names) - set(gone)
        assert len(topic_stats._NAMES[pq._ctx]) == 1
    finally:
        pq.close()


# -- packed redrive ------------------------------------------------------------------------


def _ten_letters_of_one_segment(calls: Counter[str]):  # type: ignore[no-untyped-def]
    def hooks(op: str, key: str) -> None:
        if "/segment-leases/" in key or ("/segments/" in key and op == "head"):
            calls[op] += 1

    pq = memory_queue({"publishing": {"max_segment_messages": 50}}, hooks=hooks)
    pq.create_topic("t", packed=True)
    pq.register_producer("p").publish_batch("t", list(range(20)))
    consumer = pq.register_consumer("c", ["t"])
    held = consumer.poll(20)
    assert len(held) == 20
    for msg in held[:10]:  # 10 letters; the segment stays (10 messages left)
        msg.nack("bad")
    assert sum(1 for _ in pq.store.list("t/segments/").objects) == 1
    return pq, held


def test_a_packed_redrive_reads_each_segments_lease_once() -> None:
    """Reproduces: unsettled_in_segment GET the segment's lease once per LETTER."""
    calls: Counter[str] = Counter()
    pq, _held = _ten_letters_of_one_segment(calls)
    try:
        calls.clear()
        result = pq.redrive("t")
        assert len(result.moved) == 10
        assert calls["get"] == 1, f"{calls['get']} GETs of one segment's lease"
    finally:
        pq.close()


def test_a_packed_redrive_heads_a_segment_without_a_lease_once() -> None:
    """With the segment's lease gone, each letter cost a GET and a HEAD of the segment:
    now one of each for the segment; every letter is left (the segment delivers them
    again), and the next pass reads again (the answer is kept for one pass only)."""
    calls: Counter[str] = Counter()
    pq, _held = _ten_letters_of_one_segment(calls)
    try:
        (lease,) = [o.key for o in pq.store.list(layout.segment_leases_prefix("t")).objects]
        pq.store.delete(lease)
        calls.clear()
        result = pq.redrive("t")
        assert result.moved == [] and len(result.skipped) == 10, result
        assert (calls["get"], calls["head"]) == (1, 1), calls
        pq.redrive("t")
        assert (calls["get"], calls["head"]) == (2, 2), calls
    finally:
        pq.close()


def test_a_packed_redrive_heads_a_gone_segment_once() -> None:
    calls: Counter[str] = Counter()
    pq, held = _ten_letters_of_one_segment(calls)
    try:
        for msg in held[10:]:
            msg.ack()  # the segment's last messages: it is deleted, its lease too
        assert list(pq.store.list("t/segments/").objects) == []
        calls.clear()
        result = pq.redrive("t")
        assert len(result.moved) == 10, result
        assert (calls["get"], calls["head"]) == (1, 1), calls
    finally:
        pq.close()
