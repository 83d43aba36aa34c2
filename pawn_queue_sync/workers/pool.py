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
successful poll failed to start (its handler import fails in the child although it
worked in the parent); after ``max_start_failures``
(:data:`MAX_START_FAILURES`) such failures in a row at one position the pool gives up:
it stops the other workers gracefully and returns ``RET_START_FAILED``. A child that
met an outage at its start (no answer, or a server error after every retry:
``StorageError.transient``, the child's exit ``RET_STORE_DOWN``), of a store the parent
reached (a server restarting), is restarted with the back-off until the store is back
and not counted; a store that refuses the child for good (bucket gone, credentials
revoked: ``RET_CONNECT``) counts as a start failure like any other.

The first SIGTERM/SIGINT is relayed to the children as a graceful stop (they finish
in-flight handlers, release unstarted messages, flush acks); a second one, or children
still alive ``shutdown_timeout_seconds`` + ``KILL_GRACE_S`` seconds later, stops them hard with
SIGKILL (counted in ``killed``).

A child starting (interpreter start, unpickling, imports: up to a second or more under
load) has no signal handlers yet, and a spawn child does not reliably inherit a blocked
signal mask, so the supervisor never signals it then: each child sets its ``armed``
flag once its handlers are installed, then checks the pool's ``stopping`` flag (and
exits at once, status 0, if set); at a stop the supervisor sets ``stopping`` first,
then sends SIGTERM to the armed children only. Both steps run under one lock, so
either the child sees the stop or the supervisor sees the child armed.

Each process (supervisor and children) makes its self-pipe the signal wakeup fd: a
signal the kernel hands to a thread other than the main one (Ctrl-C sends SIGINT to the
whole process group while the supervisor relays SIGTERM, so a child gets both at once)
still wakes the main thread, which is where Python runs the handler.

Each child registers a consumer of its own, ``<consumer_name>/<index>``
(:func:`child_consumer_name`): the registry rank that spreads csprng_verify claims
counts every child, and a child restarted at an index registers the same name, so the
same stable id (and its old registry entry).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import resource_tracker
from typing import Any

import attrs

from ..clock import SYSTEM_CLOCK, Clock
from ..config import PawnQueueConfig
from ..metrics import PoolMetrics
from ..runtime.options import Default, ListenOptions
from ..runtime.signals import Wakeup, install_stop_handlers
from .arguments import check_arguments, check_metrics, preflight
from .child import _checked_listener_options, _child_main, _ChildSpec
from .common import (
    _SIGNALS,
    KILL_GRACE_S,
    MAX_START_FAILURES,
    RET_CONFIG,
    RET_KILLED,
    RET_OK,
    RET_START_FAILED,
    RET_STORE_DOWN,
    child_consumer_name,
    request_stop,
)

log = logging.getLogger("pawn_queue_sync.workers")

__all__ = ["WorkerPool"]


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
    #: set to 1 by the running process once its signal handlers are installed (shared)
    armed: Any = None
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
    :meth:`stop` (safe from any thread or a signal handler). ``metrics_port``: the
    supervisor serves the workers' Prometheus metrics there (:class:`PoolMetrics`), on
    ``metrics_addr`` (default 127.0.0.1, this host only; ``0.0.0.0`` for every
    interface).
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
        shutdown_timeout_seconds: float = Default(30.0),
        restart_backoff_seconds: float = Default(1.0),
        restart_backoff_max_seconds: float = Default(30.0),
        start_method: str = "spawn",
        install_signal_handlers: bool = True,
        log_level: int | None = None,
        listener_options: ListenOptions | Mapping[str, Any] | None = None,
        max_start_failures: int = MAX_START_FAILURES,
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
        **deprecated: float,
    ) -> None:
        args = check_arguments(
            topics, processes=processes, threads=threads, consumer_name=consumer_name,
            shutdown_timeout_seconds=shutdown_timeout_seconds,
            restart_backoff_seconds=restart_backoff_seconds,
            restart_backoff_max_seconds=restart_backoff_max_seconds,
            start_method=start_method, max_start_failures=max_start_failures,
            deprecated=deprecated,
        )
        topics = args.topics
        shutdown_timeout = args.shutdown_timeout_seconds
        restart_backoff = args.restart_backoff_seconds
        restart_backoff_max = args.restart_backoff_max_seconds
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
        #: (port, address) of the metrics served by the supervisor (PoolMetrics)
        self._metrics_at = check_metrics(metrics_port, metrics_addr)
        self._metrics: PoolMetrics | None = None
        self._wakeup = Wakeup()
        self._clock: Clock = SYSTEM_CLOCK
        self._stop_requests = 0  # plain int: bumped by stop(), maybe in a signal handler
        self._slots: list[_Slot] = []
        #: set to 1 (under its lock) at the first stop request; children check it as they arm
        self._stopping: Any = None
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
            status = self._preflight() or self._serve_metrics()
            if status is not None:
                return status
            restore = self._install_signal_handlers()
            try:
                return self._supervise()
            finally:
                restore()
        finally:
            self._wakeup.close()
            if self._metrics is not None:
                self._metrics.close()

    def _serve_metrics(self) -> int | None:
        """With ``metrics_port``: serve multiprocess metrics before any worker starts
        (RET_CONFIG when the port cannot be bound)."""
        if self._metrics_at is None:
            return None
        self._metrics = PoolMetrics(*self._metrics_at, self._config_dict or {}, self._topics)
        return None if self._metrics.start() else RET_CONFIG

    @property
    def metrics_port(self) -> int | None:
        """The port the pool's metrics are served on while it runs (None: none)."""
        return self._metrics.port if self._metrics is not None else None

    def _preflight(self) -> int | None:
        """Import the handler and reach the store once; an exit status if that fails."""
        status, self._config_dict = preflight(self._config_source, self._topics, self._handler)
        return status

    def _install_signal_handlers(self) -> Callable[[], None]:
        if not self._install_signals:
            return lambda: None

        def on_signal(signum: int, frame: object) -> None:
            self.stop()

        # A signal handed to another thread wakes the supervisor's wait through this.
        restore = install_stop_handlers(on_signal, self._wakeup, _SIGNALS)
        return restore if restore is not None else (lambda: None)

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
            metrics=self._metrics.path if self._metrics is not None else None,
        )

    def _start(self, slot: _Slot) -> None:
        ready = self._mp.RawValue("b", 0)
        armed = self._mp.RawValue("b", 0)
        proc = self._mp.Process(
            target=_child_main, args=(self._spec(slot.index), ready, self._stopping, armed),
            name=f"pawnq-worker-{slot.index}",
        )
        # Not what keeps a starting child alive at a stop (the armed flag does): only
        # for signals sent to the whole process group (Ctrl-C) while it starts. A spawn
        # child inherits this mask only if multiprocessing's resource tracker already
        # runs (starting it unblocks both signals: hence ensure_running first); a
        # forkserver child never does. The child unblocks them once its handlers exist.
        if self._mp.get_start_method() == "spawn":
            resource_tracker.ensure_running()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        with self._lock:
            slot.process = proc
            slot.ready = ready
            slot.armed = armed
            slot.started_at = self._clock.monotonic()
            slot.restart_at = None
            slot.exitcode = None
        log.info("started worker %d (pid %s)", slot.index, proc.pid)

    def _supervise(self) -> int:
        log.info("starting %d worker process(es) x %d thread(s) for %s on %s",
                 self._processes, self._threads, self._handler, ", ".join(self._topics))
        self._slots = [_Slot(i) for i in range(self._processes)]
        self._stopping = self._mp.Value("b", 0)
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
                self._stop_gracefully()
                graceful_sent = True
                deadline = self._clock.monotonic() + self._shutdown_timeout + KILL_GRACE_S
            self._reap(stopping=requests >= 1)
            live = [s for s in self._slots if s.process is not None]
            if requests >= 1 and not live:
                break
            now = self._clock.monotonic()
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
            waitables.append(self._wakeup)
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
        now = self._clock.monotonic()
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
            elif proc.exitcode != RET_STORE_DOWN:  # an outage: waited out with the back-off
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

    def _stop_gracefully(self) -> None:
        """Set the pool's ``stopping`` flag, then SIGTERM the armed workers; a worker
        still starting (not armed) sees the flag when it arms, and exits."""
        with self._lock:
            slots = [s for s in self._slots if s.process is not None and s.armed is not None]
        armed = request_stop(self._stopping, [s.armed for s in slots])
        if armed is None:
            log.warning("a worker holds the stop gate's lock (killed while starting?): "
                        "signalling every worker")
            armed = [True] * len(slots)
        live = self.worker_pids()
        targets = [s.index for s, a in zip(slots, armed) if a and s.index in live]
        sent = self._signal_all(signal.SIGTERM, targets)
        log.info("stopping: asked %d worker(s) to finish; %d still starting stop as "
                 "soon as they can", sent, len(live) - len(targets))

    def _signal_all(self, signum: int, indexes: Sequence[int] | None = None) -> int:
        """Send ``signum`` to every live worker (or those at ``indexes``); how many
        were signalled."""
        sent = 0
        for index, pid in self.worker_pids().items():
            if indexes is not None and index not in indexes:
                continue
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, signum)
                sent += 1
        return sent

    def _kill_all(self) -> None:
        self.killed += self._signal_all(signal.SIGKILL)
