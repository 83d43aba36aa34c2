"""Re-review RR2: ``pawnq_consumers_alive`` (review 16B's one unlabelled gauge) is taken from
``stats[0].consumers``: a queue whose consumers are alive but which has no topic (all
deleted, or a scrape filtered to topics that are gone) exports NO gauge at all, not 2:
an alert on ``pawnq_consumers_alive == 0`` never fires and one on ``absent()`` fires
wrongly; and a registry cut at ``max_keys`` (``consumers_exact`` False) is exported as
if whole, with nothing saying it is a lower bound."""

from __future__ import annotations

from pawn_queue_sync import cli
from pawn_queue_sync.testing import memory_queue
from tests.test_cli_regressions import Store, local  # noqa: F401  (the fixture)


def test_consumers_alive_without_any_topic() -> None:
    from prometheus_client import CollectorRegistry

    from pawn_queue_sync.metrics import PrometheusMetrics

    pq = memory_queue(topics=["a"])
    try:
        for name in ("one", "two"):
            pq.register_consumer(name, ["a"]).poll(1)  # a heartbeat each
        before = CollectorRegistry()
        PrometheusMetrics(before).watch(pq, min_interval=0)
        assert before.get_sample_value("pawnq_consumers_alive") == 2.0
        pq.delete_topic("a", force=True)  # the consumers stay registered and alive
        assert pq.stats_all() == []
        registry = CollectorRegistry()
        PrometheusMetrics(registry).watch(pq, min_interval=0)
        assert registry.get_sample_value("pawnq_consumers_alive") == 2.0
    finally:
        pq.close()


def test_the_dashboard_lists_consumers_without_any_topic() -> None:
    """The same root in the dashboard: read_stats takes the consumers from the topics'
    rows, so a queue without topics shows "no consumers" while two are alive."""
    from pawn_queue_sync.dashboard.source import read_stats

    pq = memory_queue(topics=["a"])
    try:
        for name in ("one", "two"):
            pq.register_consumer(name, ["a"]).poll(1)
        assert len(read_stats(pq).consumers) == 2
        pq.delete_topic("a", force=True)
        assert len(read_stats(pq).consumers) == 2, "the live consumers vanished"
    finally:
        pq.close()


def test_the_dashboard_says_when_the_consumer_list_is_cut() -> None:
    """``consumers_exact`` (new in review 16B) reaches the page only inside each topic
    row; the page's consumers table never reads it: a registry cut at max_keys is shown
    as the whole list (the CLI says "in the first N entries")."""
    from importlib import resources

    from pawn_queue_sync.dashboard.source import read_stats

    pq = memory_queue(topics=["a"])
    try:
        for name in ("one", "two", "three"):
            pq.register_consumer(name, ["a"]).poll(1)
        reading = read_stats(pq, max_keys=2)
        assert len(reading.consumers) == 2
        assert not reading.topics[0]["consumers_exact"]
        page = resources.files("pawn_queue_sync.dashboard").joinpath(
            "static", "dashboard.js").read_text()
        assert "consumers_exact" in page, "the page never tells the list is cut"
    finally:
        pq.close()


def test_pq_consumers_lists_the_queue_s_consumers_without_any_topic() -> None:
    """``pq.consumers()`` (new): the registry alone, whole or cut at ``max_keys``."""
    pq = memory_queue(topics=["a"])
    try:
        for name in ("one", "two", "three"):
            pq.register_consumer(name, ["a"]).poll(1)
        pq.delete_topic("a", force=True)
        listed, exact = pq.consumers()
        assert sorted(c.name for c in listed) == ["one", "three", "two"] and exact
        assert all(c.alive for c in listed)
        cut, exact = pq.consumers(max_keys=2)
        assert len(cut) == 2 and not exact
    finally:
        pq.close()


def test_the_metrics_say_when_the_consumer_list_is_cut() -> None:
    """``pawnq_consumers_exact`` (new): 0 when the registry listing stopped at its bound
    (``pawnq_consumers_alive`` is then a lower bound), 1 when whole."""
    from prometheus_client import CollectorRegistry

    from pawn_queue_sync.metrics import QueueDepthCollector

    pq = memory_queue(topics=["a"])
    try:
        for name in ("one", "two", "three"):
            pq.register_consumer(name, ["a"]).poll(1)
        whole = CollectorRegistry()
        whole.register(QueueDepthCollector(pq, min_interval=0))
        assert whole.get_sample_value("pawnq_consumers_exact") == 1.0
        assert whole.get_sample_value("pawnq_consumers_alive") == 3.0
        real = pq.consumers
        pq.consumers = lambda max_keys=2: real(max_keys=2)  # type: ignore[method-assign]
        cut = CollectorRegistry()
        cut.register(QueueDepthCollector(pq, min_interval=0))
        assert cut.get_sample_value("pawnq_consumers_exact") == 0.0
        assert cut.get_sample_value("pawnq_consumers_alive") == 2.0
    finally:
        pq.close()


def test_the_dashboard_state_carries_consumers_exact() -> None:
    """The poller's snapshot (what /api/state answers, what dashboard.js reads) says the
    consumer list is cut; the page has the place that says so."""
    from importlib import resources

    from pawn_queue_sync.dashboard.poller import Poller
    from pawn_queue_sync.dashboard.source import read_stats

    pq = memory_queue(topics=["a"])
    try:
        for name in ("one", "two", "three"):
            pq.register_consumer(name, ["a"]).poll(1)
        poller = Poller(lambda: read_stats(pq, max_keys=2), 5.0).start()
        try:
            assert poller.wait_for_polls(1, timeout=30)
            state = poller.snapshot()
        finally:
            poller.stop()
        assert state["consumers_exact"] is False and len(state["consumers"]) == 2
        page = resources.files("pawn_queue_sync.dashboard").joinpath(
            "static", "index.html").read_text()
        assert 'id="consumers-cut"' in page
    finally:
        pq.close()


def test_cli_stats_lists_consumers_without_any_topic(local: Store) -> None:  # noqa: F811
    """``pawnq stats`` took the consumers from the first topic's row: none without a
    topic. Now it lists the queue's consumers (``pq.consumers()``)."""
    with local.queue() as pq:
        pq.create_topic("a")
        for name in ("one", "two"):
            pq.register_consumer(name, ["a"]).poll(1)
        pq.delete_topic("a", force=True)
    shown = local.run("stats")
    assert shown.returncode == cli.EXIT_OK, shown.stderr
    assert "no topics" in shown.stdout
    assert "consumers (2 alive of 2)" in shown.stdout, shown.stdout
    assert "one" in shown.stdout and "two" in shown.stdout


