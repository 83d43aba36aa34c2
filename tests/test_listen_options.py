"""``Consumer.listen`` takes the listener's options that the docs show
(``install_signal_handlers``, ``shutdown_timeout``, ``max_messages``, ``idle_timeout``);
it once accepted only ``max_workers`` and ``stop_event``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pawn_queue_sync import Message, PawnQueue


def test_listen_takes_the_documented_listener_options(tmp_path: Path) -> None:
    with PawnQueue({"local": {"path": str(tmp_path)}}) as pq:
        pq.create_topic("orders")
        ids = pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(5)])
        consumer = pq.register_consumer("c", ["orders"])
        seen: list[str] = []
        lock = threading.Lock()

        def handle(msg: Message) -> None:
            with lock:
                seen.append(msg.id)

        consumer.listen(
            handle, max_workers=2, install_signal_handlers=True, shutdown_timeout_seconds=5.0,
            max_messages=3,
        )
        assert len(seen) == 3 and set(seen) <= set(ids)
        consumer.listen(handle, idle_timeout_seconds=0.2)  # returns once the topic is idle
        assert sorted(seen) == sorted(ids)
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 0}
        with pytest.raises(TypeError):
            consumer.listen(handle, no_such_option=1)


def test_listen_takes_one_options_object_and_the_old_names_warn() -> None:
    """``ListenOptions`` carries the same options as keywords (which win over it); the
    names without ``_seconds`` still work, each with a DeprecationWarning naming the
    new one; giving both names of one option is a TypeError."""
    from pawn_queue_sync import Listener, ListenOptions, drain
    from pawn_queue_sync.testing import memory_queue
    from pawn_queue_sync.workers import WorkerPool

    with memory_queue(topics=["orders"]) as pq:
        ids = pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(4)])
        consumer = pq.register_consumer("c", ["orders"])
        seen: list[str] = []
        options = ListenOptions(max_workers=2, max_messages=1, idle_timeout_seconds=0.5)
        consumer.listen(lambda m: seen.append(m.id), options=options, max_messages=3)
        assert len(seen) == 3
        with pytest.warns(DeprecationWarning, match="'idle_timeout_seconds'"):
            listener = Listener(consumer, lambda m: seen.append(m.id), idle_timeout=0.5)
        assert listener.options.idle_timeout_seconds == 0.5
        listener.run()
        assert sorted(seen) == sorted(ids)
        with pytest.warns(DeprecationWarning, match="'idle_timeout_seconds'"):
            assert drain(consumer, lambda m: None, idle_timeout_s=0.2).processed == 0
        with pytest.raises(TypeError, match="both"), pytest.warns(DeprecationWarning):
            Listener(consumer, print, shutdown_timeout=1, shutdown_timeout_seconds=1)
    with pytest.warns(DeprecationWarning, match="'restart_backoff_seconds'"):
        pool = WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                          restart_backoff=0.5)
    assert pool._restart_backoff == 0.5


@pytest.mark.parametrize("as_keyword", [False, True])
def test_listen_keeps_the_max_workers_of_its_options_object(as_keyword: bool) -> None:
    """``Consumer.listen(handler, ListenOptions(max_workers=2, ...))`` runs a listener
    with those options: it once passed ``max_workers=4`` along with every options
    object, which won over the object's own ``max_workers`` (and took no positional
    options at all)."""
    from pawn_queue_sync import ListenOptions
    from pawn_queue_sync.testing import memory_queue

    with memory_queue(topics=["orders"]) as pq:
        pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(3)])
        consumer = pq.register_consumer("c", ["orders"])
        seen: list[ListenOptions] = []
        options = ListenOptions(max_workers=2, max_messages=3, idle_timeout_seconds=1.0)

        def handle(msg: Message) -> None:
            seen.extend(listener.options for listener in consumer._running())

        if as_keyword:
            consumer.listen(handle, options=options)
        else:
            consumer.listen(handle, options)
        assert seen == [options] * 3
        assert {o.max_workers for o in seen} == {2}

