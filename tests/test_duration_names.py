"""Every public duration is named ``*_seconds``; the names used before stay as
deprecated aliases, each with a DeprecationWarning naming the new one (the listener's
options, ``drain`` and ``WorkerPool``: tests/test_listen_options.py).

``process_topic`` runs here on a stand-in for Spark that runs each partition function
in this process, so the warnings of its tasks (``drain``) are seen too; the real
Spark runs of both Spark functions are in tests/test_spark.py.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.runtime import LeaseRefresher
from pawn_queue_sync.testing import memory_queue


def test_lease_refresher_takes_interval_seconds_and_the_old_name_warns() -> None:
    """``LeaseRefresher(consumer, interval_seconds=...)`` (positional use unchanged);
    ``interval=`` is its deprecated alias, naming the new one; both is a TypeError."""
    with memory_queue(topics=["orders"]) as pq:
        consumer = pq.register_consumer("c", ["orders"])
        assert LeaseRefresher(consumer, interval_seconds=2.0)._interval == 2.0
        assert LeaseRefresher(consumer, 3.0)._interval == 3.0
        with pytest.warns(DeprecationWarning, match="'interval_seconds'"):
            assert LeaseRefresher(consumer, interval=4.0)._interval == 4.0
        with pytest.raises(TypeError, match="both"), pytest.warns(DeprecationWarning):
            LeaseRefresher(consumer, interval=1.0, interval_seconds=1.0)
        with pytest.raises(TypeError):
            LeaseRefresher(consumer)
        with pytest.raises(TypeError, match="'every'"):
            LeaseRefresher(consumer, 1.0, every=1.0)
        with pytest.raises(ValueError, match="interval_seconds"):
            LeaseRefresher(consumer, 0)


class _Partitions:
    """What ``process_topic`` uses of an RDD: one partition per element, each function
    run here, in order."""

    def __init__(self, parts: list[list[Any]]) -> None:
        self._parts = parts

    def mapPartitionsWithIndex(
        self, f: Callable[[int, Iterator[Any]], Iterator[Any]]
    ) -> _Partitions:
        return _Partitions([list(f(i, iter(p))) for i, p in enumerate(self._parts)])

    def collect(self) -> list[Any]:
        return list(itertools.chain.from_iterable(self._parts))


class _SparkContext:
    def parallelize(self, items: range, slices: int) -> _Partitions:
        assert slices == len(items)
        return _Partitions([[i] for i in items])


class _Spark:
    sparkContext = _SparkContext()


def test_process_topic_takes_idle_timeout_seconds_and_the_old_name_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``process_topic(idle_timeout_seconds=...)`` (also its seventh positional
    argument) warns about nothing, not even inside its tasks (which once called
    ``drain(idle_timeout_s=...)``); ``idle_timeout_s=`` still works, with one
    DeprecationWarning naming the new name."""
    from pawn_queue_sync.spark import ProcessResult, process_topic
    from pawn_queue_sync.spark import process as process_module

    config = {"local": {"path": str(tmp_path)}, "polling": {"interval_seconds": 0.05}}
    with PawnQueue(config) as pq:
        pq.create_topic("orders")
        producer = pq.register_producer("p")
        monkeypatch.setattr(process_module, "queue_for", lambda settings: pq)
        calls: list[dict[str, Any]] = [
            {"idle_timeout_seconds": 0.1},
            {"idle_timeout_s": 0.1},
        ]
        for kwargs in calls:
            producer.publish_batch("orders", [{"n": i} for i in range(3)])
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                result = process_topic(_Spark(), "orders", lambda m: None, config,  # type: ignore[arg-type]
                                       partitions=2, **kwargs)
            assert result == ProcessResult(processed=3, failed=0, dead_lettered=0)
            deprecations = [str(w.message) for w in seen
                            if issubclass(w.category, DeprecationWarning)]
            expected = ([] if "idle_timeout_seconds" in kwargs else
                        ["'idle_timeout_s' is deprecated; use 'idle_timeout_seconds'"])
            assert deprecations == expected
        producer.publish_batch("orders", [{"n": 1}])
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            result = process_topic(_Spark(), "orders", lambda m: None, config, 1, None, 0.1)  # type: ignore[arg-type]
        assert result.processed == 1
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 0}


def test_an_old_name_and_its_new_one_both_given_is_a_type_error(tmp_path: Path) -> None:
    """``drain(idle_timeout_seconds=0.5, idle_timeout_s=7)`` ran with 7 and
    ``WorkerPool(shutdown_timeout=5, shutdown_timeout_seconds=10)`` with 5, silently;
    the Listener refused both names already. Now every renamed duration does (the new
    name given with its default's value counts as given), Spark's functions too."""
    from pawn_queue_sync import drain
    from pawn_queue_sync.spark import consume_to_dataframe, process_topic
    from pawn_queue_sync.workers import WorkerPool

    with memory_queue(topics=["orders"]) as pq:
        consumer = pq.register_consumer("c", ["orders"])
        for new in (0.5, 5.0):
            with pytest.raises(TypeError, match="both 'idle_timeout_s' and "
                                                "'idle_timeout_seconds' given"), \
                    pytest.warns(DeprecationWarning):
                drain(consumer, lambda m: None, idle_timeout_seconds=new, idle_timeout_s=7)
    for old, new, value in [("shutdown_timeout", "shutdown_timeout_seconds", 10.0),
                            ("shutdown_timeout", "shutdown_timeout_seconds", 30.0),
                            ("restart_backoff", "restart_backoff_seconds", 1.0),
                            ("restart_backoff_max", "restart_backoff_max_seconds", 30.0)]:
        with pytest.raises(TypeError, match=f"both {old!r} and {new!r} given"), \
                pytest.warns(DeprecationWarning):
            WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                       **{old: 5.0, new: value})  # type: ignore[arg-type]
    config = {"local": {"path": str(tmp_path)}}
    for new in (0.5, 5.0):
        with pytest.raises(TypeError, match="both"), pytest.warns(DeprecationWarning):
            process_topic(_Spark(), "orders", lambda m: None, config,  # type: ignore[arg-type]
                          idle_timeout_seconds=new, idle_timeout_s=7)
    for new in (0.5, 1.0):
        with pytest.raises(TypeError, match="both"), pytest.warns(DeprecationWarning):
            consume_to_dataframe(_Spark(), "orders", config,  # type: ignore[arg-type]
                                 idle_timeout_seconds=new, idle_timeout_s=7)
