"""A worker process of a :class:`~pawn_queue_sync.workers.WorkerPool`: started with a
fork-safe method, it builds its own queue from plain settings, imports the handler by
name and runs a :class:`~pawn_queue_sync.runtime.Listener` until told to stop."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import attrs

from ..config import load_config
from ..errors import RegistrationError, StorageError
from ..metrics import PoolMetrics
from ..queue.core import PawnQueue
from ..runtime import Listener
from ..runtime.options import ListenOptions, option_names
from .common import (
    _READY_CHECK_S,
    _SIGNALS,
    RET_CONNECT,
    RET_IMPORT,
    RET_KILLED,
    RET_STORE_DOWN,
    HandlerImportError,
    arm,
    import_handler,
)

log = logging.getLogger("pawn_queue_sync.workers")

@attrs.frozen
class _ChildSpec:
    """Everything a worker process needs: plain, picklable data, never a client."""

    config: dict[str, Any] = attrs.field(repr=False)  # includes credentials: never log
    topics: tuple[str, ...]
    handler: str
    threads: int
    consumer_name: str  # this child's own: child_consumer_name(pool's name, index)
    shutdown_timeout: float
    log_level: int
    index: int
    listener_options: dict[str, Any] = attrs.field(factory=dict)
    #: the supervisor's multiprocess metrics directory to count events into (PoolMetrics)
    metrics: str | None = None


# -- the worker process --------------------------------------------------------------------


#: Listener keyword arguments the pool sets itself, for every child.
_POOL_SET = frozenset({"max_workers", "shutdown_timeout_seconds", "shutdown_timeout",
                       "install_signal_handlers", "name"})


def _checked_listener_options(
    options: ListenOptions | Mapping[str, Any] | None,
) -> dict[str, Any]:
    """``options`` if every name is a Listener option the pool leaves to the caller;
    a misspelled one is a ValueError here, not a TypeError in every child (each of
    which would die before polling until the pool gave up). A ListenOptions setting a
    field the pool sets (``max_workers``: ``threads=``, ...) is the same ValueError,
    not a silent drop."""
    if isinstance(options, ListenOptions):  # the fields it sets (not left at default)
        defaults = ListenOptions()
        options = {k: v for k, v in attrs.asdict(options).items()
                   if k not in _POOL_SET or v != getattr(defaults, k)}
    options = dict(options or {})
    known = option_names() - _POOL_SET
    owned = sorted(set(options) & _POOL_SET)
    if owned:
        raise ValueError(
            f"listener option(s) {', '.join(map(repr, owned))} are set by the pool (its "
            f"threads, shutdown_timeout_seconds, install_signal_handlers, consumer_name); "
            f"known: {', '.join(sorted(known))}"
        )
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"unknown listener option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    return options


def _child_main(spec: _ChildSpec, ready: Any = None, stopping: Any = None,
                armed: Any = None) -> None:
    """Entry point of a worker process (runs in a fresh interpreter). ``ready`` (shared
    memory) is set to 1 after the first successful poll: the worker has started.
    ``armed`` is set once our signal handlers are installed: until then the pool sends
    us no signal (its default action would kill us); if the pool's ``stopping`` flag
    was set before that, we exit at once (0)."""
    listener: Listener | None = None
    stop_asked = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_asked
        stop_asked = True
        if listener is not None:
            listener.stop()

    for s in _SIGNALS:
        signal.signal(s, on_signal)
    # pending if they came while the parent blocked them around our start (see pool._start)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    _setup_child_logging(spec.log_level)
    name = spec.consumer_name  # ours alone: <pool's consumer_name>/<index>
    if stopping is not None and armed is not None and arm(stopping, armed):
        log.info("worker %s: the pool stopped while it started: exiting", name)
        return
    try:
        handler = import_handler(spec.handler)
    except HandlerImportError as exc:
        log.error("worker %s: %s", name, exc)
        sys.exit(RET_IMPORT)
    try:
        on_event = PoolMetrics.child_callback(spec.metrics) if spec.metrics else None
        pq = PawnQueue(load_config(spec.config), on_event=on_event).setup()
        consumer = pq.register_consumer(spec.consumer_name, list(spec.topics))
    except (StorageError, RegistrationError, OSError) as exc:
        log.error("worker %s: cannot reach the store: %s", name, exc)
        transient = getattr(exc, "transient", False)  # OSError: a local store, not an outage
        sys.exit(RET_STORE_DOWN if transient else RET_CONNECT)
    try:
        # The listener's own signal handlers make its self-pipe the wakeup fd: a signal
        # handed to another thread of ours still wakes the main thread's wait (without
        # it Ctrl-C, SIGINT and the supervisor's SIGTERM at once, was mostly missed).
        options = {**spec.listener_options, "install_signal_handlers": True}
        listener = Listener(
            consumer, handler, max_workers=spec.threads,
            shutdown_timeout_seconds=spec.shutdown_timeout, name=name, **options,
        )
        if stop_asked:
            listener.stop()
        _watch_parent(listener)
        if ready is not None:
            _report_first_poll(listener, ready)
        listener.run()
    finally:
        if listener is not None and listener.unfinished:
            # a handler outlived the shutdown timeout: do not wait for it at exit
            log.error("worker %s: %d handler(s) still running after %.0f s; exiting hard",
                      name, listener.unfinished, spec.shutdown_timeout)
            logging.shutdown()
            os._exit(RET_KILLED)
        pq.teardown()


def _watch_parent(listener: Listener) -> None:
    """Stop gracefully if the supervisor dies (no orphan keeps consuming)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        if not listener.stopping:
            log.warning("the worker pool's supervisor died: stopping")
        listener.stop()

    threading.Thread(target=watch, name="pawnq-parent-watch", daemon=True).start()


def _report_first_poll(listener: Listener, ready: Any) -> None:
    """Set ``ready`` once the listener has polled successfully (the worker started)."""

    def watch() -> None:
        while not listener.stopping:
            if listener.stats.polls:
                ready.value = 1
                return
            time.sleep(_READY_CHECK_S)

    threading.Thread(target=watch, name="pawnq-ready-watch", daemon=True).start()


def _setup_child_logging(level: int) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=level or logging.WARNING,
            format="%(asctime)s %(processName)s[%(process)d] %(levelname)s %(name)s: "
                   "%(message)s",
        )


