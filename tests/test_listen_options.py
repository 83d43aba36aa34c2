"""``Consumer.listen`` takes the listener's options that the docs show
(``install_signal_handlers``, ``shutdown_timeout``, ``max_messages``, ``idle_timeout``);
it once accepted only ``max_workers`` and ``stop_event``."""

from __future__ import annotations

import math
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



@pytest.mark.parametrize("options", [{"max_workers": 2}, 2, "fast"])
def test_options_that_are_not_a_listen_options_are_a_type_error(options: object) -> None:
    """``Listener(c, h, {"max_workers": 2})`` (or a number) raised AttributeError from
    deep inside; ``Consumer.listen`` the same. A TypeError names what goes there."""
    from pawn_queue_sync import Listener
    from pawn_queue_sync.testing import memory_queue

    with memory_queue(topics=["orders"]) as pq:
        consumer = pq.register_consumer("c", ["orders"])
        with pytest.raises(TypeError, match="ListenOptions"):
            Listener(consumer, lambda m: None, options)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="ListenOptions"):
            consumer.listen(lambda m: None, options)  # type: ignore[arg-type]


@pytest.mark.parametrize("fields", [{"max_workers": 16}, {"shutdown_timeout_seconds": 120},
                                    {"install_signal_handlers": True}, {"name": "mine"}])
def test_worker_pool_refuses_listen_options_that_set_what_the_pool_sets(
        fields: dict[str, object]) -> None:
    """``WorkerPool(listener_options=ListenOptions(shutdown_timeout_seconds=120))`` was
    accepted and the field silently dropped (the pool sets it for every child); the same
    name in a dict is a ValueError, and now in a ListenOptions too."""
    from pawn_queue_sync import ListenOptions
    from pawn_queue_sync.workers import WorkerPool

    (name,) = fields
    with pytest.raises(ValueError, match=name):
        WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                   listener_options=ListenOptions(**fields))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=name):
        WorkerPool({}, ["orders"], "tests.runtime_handlers:record", listener_options=fields)
    pool = WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                      listener_options=ListenOptions(ack_batch_size=10))
    assert pool is not None


DURATIONS = ["idle_timeout_seconds", "shutdown_timeout_seconds", "handler_timeout_seconds",
             "ack_flush_interval_seconds", "poll_coalesce_seconds", "retry_backoff_seconds",
             "retry_backoff_max_seconds"]


@pytest.mark.parametrize("value", [math.inf, math.nan])
@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_that_is_not_finite_is_refused(name: str, value: float) -> None:
    """``handler_timeout_seconds=float("inf")`` passed validation, then the settler's
    wait raised OverflowError and the settler thread died (the message stayed leased):
    every listener duration must be a finite number of seconds (ValueError, as other
    bad values are), also given through drain() or Consumer.listen."""
    from pawn_queue_sync import Listener, ListenOptions, drain
    from pawn_queue_sync.testing import memory_queue

    with pytest.raises(ValueError, match=name):
        ListenOptions(**{name: value})  # type: ignore[arg-type]
    with memory_queue(topics=["orders"]) as pq:
        consumer = pq.register_consumer("c", ["orders"])
        with pytest.raises(ValueError, match=name):
            Listener(consumer, lambda m: None, **{name: value})
        with pytest.raises(ValueError, match=name):
            consumer.listen(lambda m: None, **{name: value})
        if name in ("idle_timeout_seconds", "handler_timeout_seconds"):
            with pytest.raises(ValueError, match=name):
                drain(consumer, lambda m: None, **{name: value})
