"""Supervised worker processes: ``WorkerPool`` and ``pawnq worker``.

The parent never talks to the store while children run and never hands them a client:
each child is started with a fork-safe method (``spawn`` by default), receives the
configuration as plain data (``PawnQueueConfig.to_dict()``), builds its own
:class:`~pawn_queue_sync.PawnQueue` (so its own boto3 client), imports the handler by
its ``"package.module:function"`` name and runs a :class:`Listener` with ``threads``
handler threads.

Before starting children the parent imports the handler (``RET_IMPORT`` if it cannot)
and connects once to the store, checking the topics (``RET_CONNECT`` / ``RET_CONFIG``).
Then it supervises: a child that dies unexpectedly is restarted after a backoff that
doubles with consecutive crashes (logged and counted in ``restarts``); its leases
expire and other workers take its messages. A child that dies before its first
successful poll failed to start (its handler import or store connection fails in the
child although it worked in the parent); after ``max_start_failures``
(:data:`MAX_START_FAILURES`) such failures in a row at one position the pool gives up:
it stops the other workers gracefully and returns ``RET_START_FAILED``.

The first SIGTERM/SIGINT is relayed to the children as a graceful stop (they finish
in-flight handlers, release unstarted messages, flush acks); a second one, or children
still alive ``shutdown_timeout`` + ``KILL_GRACE_S`` seconds later, stops them hard with
SIGKILL (counted in ``killed``).

As in dramatiq's CLI, SIGINT and SIGTERM are blocked while a child starts, so a signal
arriving then waits until the child has installed its handlers instead of killing it
half-started. Each process (supervisor and children) makes its self-pipe the signal
wakeup fd: a signal the kernel hands to a thread other than the main one (Ctrl-C sends
SIGINT to the whole process group while the supervisor relays SIGTERM, so a child gets
both at once) still wakes the main thread, which is where Python runs the handler.

Each child registers a consumer of its own, ``<consumer_name>/<index>``
(:func:`child_consumer_name`): the registry rank that spreads csprng_verify claims
counts every child, and a child restarted at an index registers the same name, so the
same stable id (and its old registry entry).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..config import PawnQueueConfig, load_config
from ..errors import ConfigError, PawnQueueError, StorageError, TopicNotFoundError
from .listen import Listener, _Wakeup

log = logging.getLogger(__name__)

__all__ = [
    "WorkerPool",
    "child_consumer_name",
    "import_handler",
    "HandlerImportError",
    "RET_OK",
    "RET_KILLED",
    "RET_IMPORT",
    "RET_CONNECT",
    "RET_CONFIG",
    "RET_START_FAILED",
    "MAX_START_FAILURES",
]

#: Stopped gracefully; every worker exited cleanly.
RET_OK = 0
#: Stopped hard (second signal, or workers outlived the shutdown timeout), or a worker
#: did not exit cleanly when asked to stop.
RET_KILLED = 1
#: The handler could not be imported (5, not 2: 2 is argparse's usage error, which
#: ``pawnq worker`` and ``python -m pawn_queue_sync.runtime.workers`` also exit with).
RET_IMPORT = 5
#: The store could not be reached (or refused us) at startup.
RET_CONNECT = 3
#: Invalid configuration, or a topic that does not exist.
RET_CONFIG = 4
#: Workers kept failing to start (``max_start_failures`` in a row at one position, each
#: dying before its first successful poll): the pool gave up.
RET_START_FAILED = 6

#: Default ``max_start_failures``: consecutive start failures of one worker position
#: after which the pool gives up (``RET_START_FAILED``) instead of restarting forever.
MAX_START_FAILURES = 5
#: How often a starting worker looks whether its first poll succeeded.
_READY_CHECK_S = 0.05

#: Seconds the parent waits beyond ``shutdown_timeout`` before SIGKILLing workers.
KILL_GRACE_S = 10.0

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


#: The registry's limit on a consumer name (see queue.registry.register).
_MAX_NAME = 256


def child_consumer_name(consumer_name: str, index: int) -> str:
    """The consumer name worker ``index`` of a pool named ``consumer_name`` registers:
    ``"<consumer_name>/<index>"``, the same for every process started at that index."""
    return f"{consumer_name}/{index}"


class HandlerImportError(ImportError):
    """A ``"package.module:function"`` handler name that does not resolve to a callable."""


def import_handler(spec: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:function"`` (``function`` may be dotted,
    e.g. ``"pkg.mod:Class.method"``). Raises HandlerImportError saying why not."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise HandlerImportError(f"handler {spec!r} is not of the form 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerImportError(
            f"cannot import module {module_name!r} for handler {spec!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HandlerImportError(
                f"module {module_name!r} has no attribute {attr_path!r} (handler {spec!r})"
            ) from None
    if not callable(obj):
        raise HandlerImportError(f"handler {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]


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


@attrs.define
class _Slot:
    """One worker position; its process is replaced when it dies."""

    index: int
    process: multiprocessing.process.BaseProcess | None = None
    started_at: float = 0.0
    crashes: int = 0  # consecutive quick deaths, for the restart backoff
    start_failures: int = 0  # consecutive deaths before a first successful poll
    #: set to 1 by the running process after its first successful poll (shared memory)
    ready: Any = None
    restart_at: float | None = None
    exitcode: int | None = None  # exit code after a stop request


class WorkerPool:
    """``processes`` worker processes x ``threads`` handler threads, supervised.

    ``config`` is anything :func:`~pawn_queue_sync.load_config` takes (a config, a dict,
    a YAML path, or None for the environment). ``listener_options`` are extra keyword
    arguments for each worker's :class:`Listener` (e.g. ``ack_batch_size``); a worker's
    in-flight capacity is ``threads + ack_batch_size`` messages. ``run()`` blocks and
    returns an exit
    status (``RET_*``). Signal handlers are installed only when ``run()`` is called in
    the main thread and ``install_signal_handlers`` is true; otherwise call
    :meth:`stop` (safe from any thread or a signal handler).
    """

    def __init__(
        self,
        config: PawnQueueConfig | Mapping[str, Any] | str | os.PathLike[str] | None,
        topics: Sequence[str],
        handler: str,
        *,
        processes: int = 1,
        threads: int = 4,
        consumer_name: str = "worker",
        shutdown_timeout: float = 30.0,
        restart_backoff: float = 1.0,
        restart_backoff_max: float = 30.0,
        start_method: str = "spawn",
        install_signal_handlers: bool = True,
        log_level: int | None = None,
        listener_options: Mapping[str, Any] | None = None,
        max_start_failures: int = MAX_START_FAILURES,
    ) -> None:
        if isinstance(topics, str):
            topics = [topics]
        if not topics:
            raise ValueError("a worker pool needs at least one topic")
        if processes < 1 or threads < 1:
            raise ValueError("processes and threads must be >= 1")
        for label, value in (("shutdown_timeout", shutdown_timeout),
                             ("restart_backoff", restart_backoff),
                             ("restart_backoff_max", restart_backoff_max)):
            # inf or nan would crash the supervisor's waits (at the first stop request)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise ValueError(
                    f"{label} must be a finite number of seconds >= 0, got {value!r}")
        if isinstance(max_start_failures, bool) or not isinstance(max_start_failures, int) \
                or max_start_failures < 1:
            raise ValueError(f"max_start_failures must be an int >= 1, got "
                             f"{max_start_failures!r}")
        if start_method == "fork":
            raise ValueError("fork is not fork-safe with boto3 clients: use spawn or forkserver")
        if (not isinstance(consumer_name, str) or not consumer_name
                or len(child_consumer_name(consumer_name, processes - 1)) > _MAX_NAME):
            raise ValueError(
                f"consumer_name must be a non-empty string; worker i registers as "
                f"'<consumer_name>/i', at most {_MAX_NAME} characters"
            )
        self._config_source = config
        self._topics = tuple(topics)
        self._handler = handler
        self._processes = processes
        self._threads = threads
        self._consumer_name = consumer_name
        self._shutdown_timeout = float(shutdown_timeout)
        self._restart_backoff = float(restart_backoff)
        self._restart_backoff_max = float(restart_backoff_max)
        self._max_start_failures = max_start_failures
        self._mp = multiprocessing.get_context(start_method)
        self._install_signals = install_signal_handlers
        self._log_level = log_level if log_level is not None else logging.getLogger().level
        self._listener_options = _checked_listener_options(listener_options)
        self._wakeup = _Wakeup()
        self._stop_requests = 0  # plain int: bumped by stop(), maybe in a signal handler
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._ran = False
        #: set by the supervisor when a worker position kept failing to start
        self._gave_up = False
        #: how many times a worker that died unexpectedly was restarted
        self.restarts = 0
        #: how many worker processes had to be SIGKILLed (0 after a clean stop)
        self.killed = 0

    def __repr__(self) -> str:
        return (
            f"WorkerPool(handler={self._handler!r}, topics={list(self._topics)!r}, "
            f"processes={self._processes}, threads={self._threads})"
        )

    # -- control ----------------------------------------------------------------------

    def stop(self, hard: bool = False) -> None:
        """First call: graceful stop; a second call (or ``hard=True``): SIGKILL the
        workers. Returns at once; safe from any thread or a signal handler."""
        self._stop_requests += 2 if hard else 1
        self._wakeup.notify()

    def worker_pids(self) -> dict[int, int]:
        """Worker index -> process id, for the workers currently alive."""
        with self._lock:
            return {
                s.index: s.process.pid for s in self._slots
                if s.process is not None and s.process.pid is not None and s.process.is_alive()
            }

    # -- run ---------------------------------------------------------------------------

    def run(self) -> int:
        """Check, start the workers, supervise them until stopped; the exit status.
        A WorkerPool runs once."""
        if self._ran:
            raise RuntimeError("a WorkerPool runs only once; make a new one")
        self._ran = True
        try:
            status = self._preflight()
            if status is not None:
                return status
            restore = self._install_signal_handlers()
            try:
                return self._supervise()
            finally:
                restore()
        finally:
            self._wakeup.close()

    def _preflight(self) -> int | None:
        """Import the handler and reach the store once; an exit status if that fails."""
        try:
            import_handler(self._handler)
        except HandlerImportError as exc:
            log.error("%s", exc)
            return RET_IMPORT
        try:
            config = load_config(self._config_source)
        except (ConfigError, OSError) as exc:
            log.error("invalid configuration: %s", exc)
            return RET_CONFIG
        self._config_dict = config.to_dict()
        from ..queue.core import PawnQueue

        pq = PawnQueue(config)
        try:
            pq.setup()
            for topic in self._topics:
                pq.context.require_topic(topic)
        except TopicNotFoundError as exc:
            log.error("%s", exc)
            return RET_CONFIG
        except ConfigError as exc:
            log.error("invalid configuration: %s", exc)
            return RET_CONFIG
        except (StorageError, PawnQueueError, OSError) as exc:
            log.error("cannot reach the store: %s", exc)
            return RET_CONNECT
        finally:
            pq.teardown()
        return None

    def _install_signal_handlers(self) -> Callable[[], None]:
        if not self._install_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_signal(signum: int, frame: object) -> None:
            self.stop()

        previous = {s: signal.signal(s, on_signal) for s in _SIGNALS}
        # A signal handed to another thread wakes the supervisor's wait through this.
        previous_fd = signal.set_wakeup_fd(self._wakeup.write_fd(), warn_on_full_buffer=False)

        def restore() -> None:
            signal.set_wakeup_fd(previous_fd)
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def _spec(self, index: int) -> _ChildSpec:
        return _ChildSpec(
            config=self._config_dict,
            topics=self._topics,
            handler=self._handler,
            threads=self._threads,
            consumer_name=child_consumer_name(self._consumer_name, index),
            shutdown_timeout=self._shutdown_timeout,
            log_level=self._log_level,
            index=index,
            listener_options=self._listener_options,
        )

    def _start(self, slot: _Slot) -> None:
        ready = self._mp.RawValue("b", 0)
        proc = self._mp.Process(
            target=_child_main, args=(self._spec(slot.index), ready),
            name=f"pawnq-worker-{slot.index}",
        )
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            proc.start()  # the child inherits the blocked mask and unblocks when ready
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        with self._lock:
            slot.process = proc
            slot.ready = ready
            slot.started_at = time.monotonic()
            slot.restart_at = None
            slot.exitcode = None
        log.info("started worker %d (pid %s)", slot.index, proc.pid)

    def _supervise(self) -> int:
        log.info("starting %d worker process(es) x %d thread(s) for %s on %s",
                 self._processes, self._threads, self._handler, ", ".join(self._topics))
        self._slots = [_Slot(i) for i in range(self._processes)]
        for slot in self._slots:
            if self._stop_requests:
                break
            self._start(slot)
        graceful_sent = False
        hard = False
        deadline: float | None = None
        while True:
            requests = self._stop_requests
            if self._gave_up:
                requests = max(requests, 1)
            if requests >= 2 and not hard:
                log.warning("second stop request: killing the workers")
                self._kill_all()
                hard = True
            elif requests >= 1 and not graceful_sent:
                log.info("stopping: asking %d worker(s) to finish", len(self.worker_pids()))
                self._signal_all(signal.SIGTERM)
                graceful_sent = True
                deadline = time.monotonic() + self._shutdown_timeout + KILL_GRACE_S
            self._reap(stopping=requests >= 1)
            live = [s for s in self._slots if s.process is not None]
            if requests >= 1 and not live:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline and not hard:
                log.error("workers still running %.0f s after the stop request: killing",
                          self._shutdown_timeout + KILL_GRACE_S)
                self._kill_all()
                hard = True
                continue
            if requests == 0:
                for slot in self._slots:
                    if slot.process is None and slot.restart_at is not None \
                            and slot.restart_at <= now:
                        self._start(slot)
                        live.append(slot)
            timeouts = [s.restart_at - now for s in self._slots
                        if s.process is None and s.restart_at is not None and requests == 0]
            if deadline is not None and not hard:
                timeouts.append(deadline - now)
            timeout = max(min(timeouts), 0.0) if timeouts else None
            waitables: list[Any] = [s.process.sentinel for s in live if s.process is not None]
            waitables.append(self._wakeup._r)
            multiprocessing.connection.wait(waitables, timeout)
            self._wakeup.wait(0)  # drain
        if self._gave_up:
            status = RET_START_FAILED
        elif hard:
            status = RET_KILLED
        elif any(s.exitcode not in (0, None) for s in self._slots):
            log.error("worker exit codes: %s", [s.exitcode for s in self._slots])
            status = RET_KILLED
        else:
            status = RET_OK
        log.info("worker pool stopped (status %d, %d restart(s), %d worker(s) killed)",
                 status, self.restarts, self.killed)
        return status

    def _reap(self, stopping: bool) -> None:
        """Collect dead workers; schedule a restart of those that died unexpectedly."""
        now = time.monotonic()
        for slot in self._slots:
            proc = slot.process
            if proc is None or proc.exitcode is None:
                continue
            proc.join()
            with self._lock:
                slot.process = None
            if stopping:
                slot.exitcode = proc.exitcode  # what the stop request led to
                log.info("worker %d (pid %s) exited with %s", slot.index, proc.pid,
                         proc.exitcode)
                continue
            lived = now - slot.started_at
            if slot.ready is not None and slot.ready.value:
                slot.start_failures = 0
            else:
                slot.start_failures += 1
                if slot.start_failures >= self._max_start_failures:
                    log.error(
                        "worker %d (pid %s) failed to start %d time(s) in a row (exit code "
                        "%s; it died before its first successful poll, see its error "
                        "above): giving up", slot.index, proc.pid, slot.start_failures,
                        proc.exitcode,
                    )
                    self._gave_up = True
                    self._wakeup.notify()
                    continue
            slot.crashes = 1 if lived > max(self._restart_backoff_max, 10.0) else slot.crashes + 1
            delay = min(self._restart_backoff * 2 ** (slot.crashes - 1), self._restart_backoff_max)
            slot.restart_at = now + delay
            self.restarts += 1
            log.warning(
                "worker %d (pid %s) died unexpectedly with exit code %s after %.1f s; "
                "restarting it in %.1f s (restart #%d)",
                slot.index, proc.pid, proc.exitcode, lived, delay, self.restarts,
            )

    def _signal_all(self, signum: int) -> int:
        """Send ``signum`` to every live worker; how many were signalled."""
        sent = 0
        for pid in self.worker_pids().values():
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, signum)
                sent += 1
        return sent

    def _kill_all(self) -> None:
        self.killed += self._signal_all(signal.SIGKILL)


# -- the worker process --------------------------------------------------------------------


#: Listener keyword arguments the pool sets itself, for every child.
_POOL_SET = frozenset(
    {"consumer", "handler", "max_workers", "shutdown_timeout", "install_signal_handlers", "name"}
)


def _checked_listener_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` if every name is a Listener option the pool leaves to the caller;
    a misspelled one is a ValueError here, not a TypeError in every child (each of
    which would die before polling until the pool gave up)."""
    options = dict(options or {})
    known = set(inspect.signature(Listener.__init__).parameters) - {"self"} - _POOL_SET
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"unknown listener option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    return options


def _child_main(spec: _ChildSpec, ready: Any = None) -> None:
    """Entry point of a worker process (runs in a fresh interpreter). ``ready`` (shared
    memory) is set to 1 after the first successful poll: the worker has started."""
    listener: Listener | None = None
    stop_asked = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_asked
        stop_asked = True
        if listener is not None:
            listener.stop()

    for s in _SIGNALS:
        signal.signal(s, on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)  # blocked by the parent at start
    _setup_child_logging(spec.log_level)
    name = spec.consumer_name  # ours alone: <pool's consumer_name>/<index>
    try:
        handler = import_handler(spec.handler)
    except HandlerImportError as exc:
        log.error("worker %s: %s", name, exc)
        sys.exit(RET_IMPORT)
    from ..queue.core import PawnQueue

    try:
        pq = PawnQueue(load_config(spec.config)).setup()
    except (StorageError, OSError) as exc:
        log.error("worker %s: cannot reach the store: %s", name, exc)
        sys.exit(RET_CONNECT)
    try:
        consumer = pq.register_consumer(spec.consumer_name, list(spec.topics))
        # The listener's own signal handlers make its self-pipe the wakeup fd: a signal
        # handed to another thread of ours still wakes the main thread's wait (without
        # it Ctrl-C, SIGINT and the supervisor's SIGTERM at once, was mostly missed).
        options = {**spec.listener_options, "install_signal_handlers": True}
        listener = Listener(
            consumer, handler, max_workers=spec.threads,
            shutdown_timeout=spec.shutdown_timeout, name=name, **options,
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


if __name__ == "__main__":
    from .cli_worker import main

    sys.exit(main())
