"""Push-mode consuming: a poll thread feeding a thread pool, with bounded prefetch.

One class per loop, in dramatiq's manner: :class:`~.poller.Poller` (the poll thread),
:class:`~.inflight.InFlight` (the bounded in-flight counter), :class:`~.handling.HandlerPool`
(the handler threads and outcomes), :class:`~.settler.Settler` (ack batches, the retry
heap, handler timeouts); :class:`Listener` starts them, stops them in order, and joins
them. They share one Condition and the clock (:class:`~.state.Shared`): every wait
and every time read goes through ``consumer.context.clock``.

Threads of one :class:`Listener` (all joined before :meth:`Listener.run` returns):

* the **poll thread** claims at most ``min(free worker slots, max_messages_per_poll)``
  messages per poll; a slot is taken before a message is submitted and given back by
  the future's done-callback (s3transfer's ``BoundedExecutor``), so claimed but
  unstarted messages never outnumber idle workers. A poll that found messages polls
  again at once; empty polls after one that found messages back off exponentially up to
  ``polling.interval_seconds`` (before the first message: that interval from the start);
  store errors are logged and retried with backoff, never fatal;
* the **handler pool** (``max_workers`` threads) runs the handler. Returns -> ack
  (unless the handler settled the message itself); raises -> retried after an
  exponential, capped backoff via ``consumer.retry`` (which records the attempt in the
  message), or dead-lettered with the error once ``delivery_count`` reaches
  ``polling.max_delivery_count``;
* the **settler thread** batches acks into ``consumer.ack_many`` (flushed every
  ``ack_flush_interval`` seconds or ``ack_batch_size`` messages, and on stop: two
  DeleteObjects per batch instead of two DELETEs per message) and runs retries whose
  backoff has elapsed. A message waiting for its retry keeps its lease but no worker.
  It also gives up on handlers running past ``handler_timeout_seconds`` (their leases
  are no longer renewed; see :class:`Listener`). A failed ack is retried after a store
  error only; any other exception is logged with its traceback and the batch given up;
* the **lease refresher** renews every held lease (running handlers, pending acks,
  pending retries), on up to ``polling.claim_threads`` threads, closest to expiry first,
  so no message being worked on is redelivered and a retry's backoff never outlives its
  lease; a message leaves it just before its ack, dead-letter, retry or release (a
  refresh under way is waited for, so none lands after the lease was deleted).

Stopping (:meth:`Listener.stop`, the ``stop_event``, or a signal when asked to install
handlers) follows dramatiq's order: no new claims; unstarted messages are released at
once; running handlers get ``shutdown_timeout_seconds`` to finish while their leases
are still renewed; pending acks are flushed and pending retries recorded; the
refresher stops last; every thread is joined; then the consumer gives back the
segments of packed topics it holds with no message out (``consumer.give_back()``).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any

from ..clock import wait_for
from .handling import HandlerPool
from .inflight import InFlight
from .options import ListenOptions, resolve_options
from .poller import Poller
from .ports import ConsumerPort, Handler
from .refresher import LeaseRefresher
from .settler import Settler
from .signals import Wakeup, install_stop_handlers
from .state import ListenerStats, Shared, describe_error

log = logging.getLogger(__name__)

__all__ = ["Handler", "Listener", "ListenerStats", "ListenOptions", "describe_error"]

#: How often the main thread of a listener with signal handlers looks at its stop flag.
SIGNAL_CHECK_S = 1.0


class Listener:
    """Hands each message of ``consumer`` to ``handler`` on ``max_workers`` threads.

    ``run()`` blocks until stopped: :meth:`stop` (from any thread or a signal handler),
    ``stop_event`` being set, ``max_messages`` handler calls done, or ``idle_timeout_seconds``
    seconds with nothing to do. A Listener runs once.

    Nothing touches signals unless ``install_signal_handlers=True`` and ``run()`` is
    called in the main thread; then SIGTERM and SIGINT stop it gracefully and the
    previous handlers are restored when ``run()`` returns.

    Tuning: at most ``max_workers + ack_batch_size`` messages are in hand at once
    (claimed and not yet acked, dead-lettered or given back): that bounds what a
    crash can redeliver. ``poll_coalesce_seconds``: when fewer than half the workers
    are free, wait up to this long for more before polling (one poll, two LISTs, then
    serves several messages). ``retry_backoff_seconds`` doubles per delivery up to
    ``retry_backoff_max_seconds``. ``shutdown_timeout_seconds``: how long running
    handlers get at stop; one still running then is abandoned (``unfinished``), its
    lease left to expire. Options are :class:`ListenOptions` fields (every duration in
    seconds).

    ``handler_timeout_seconds`` (None: no limit): a handler call running longer is
    given up on. Its lease is no longer renewed and is left to expire (not released:
    the thread may still finish, and its ack then succeeds if nobody took the message
    meanwhile, or raises LeaseLostError, deleting nothing, if someone did; releasing
    would hand the message to another consumer at once, while the work is still under
    way). It counts in ``stats.timed_out`` and ``stats.stuck`` and is logged as a
    warning naming the message and how long the handler has run (again at 2x, 4x, ...
    the timeout while it runs on). Python cannot stop a thread: a stuck handler keeps
    its worker slot until it returns, so no more than ``max_workers`` threads ever run
    handlers; a listener whose every slot is stuck consumes nothing (see
    ``stats.stuck``, :meth:`stuck_handlers`). Stuck handlers do not keep the listener
    busy: ``idle_timeout_seconds`` and ``max_messages`` stop it past them, and the shutdown
    does not wait for them (they count in ``unfinished``). A handler that returns
    late is settled as usual (a failure is recorded at once, without backoff).
    """

    def __init__(
        self,
        consumer: ConsumerPort,
        handler: Handler,
        options: ListenOptions | None = None,
        *,
        stop_event: threading.Event | None = None,
        **kwargs: Any,
    ) -> None:
        """``options`` (a :class:`ListenOptions`) and/or its fields as keywords (which
        win); the names without ``_seconds`` are deprecated aliases."""
        opts = resolve_options(options, kwargs)
        self.options = opts
        self._consumer = consumer
        self._max_workers = opts.max_workers
        self._stop_event = stop_event
        self._shutdown_timeout = opts.shutdown_timeout_seconds
        self._install_signals = opts.install_signal_handlers
        self._name = name = opts.name or consumer.name
        polling = consumer.context.config.polling
        self._clock = consumer.context.clock
        self._refresher = LeaseRefresher(
            consumer, polling.lease_refresh_interval_seconds,
            name=f"pawnq-refresher-{name}",
        )
        self._s = Shared(consumer=consumer, refresher=self._refresher, clock=self._clock,
                         polling=polling, name=name, max_workers=opts.max_workers,
                         request_stop=self.stop)
        self.stats: ListenerStats = self._s.stats
        self._inflight = InFlight(
            self._s, capacity=opts.max_workers + opts.ack_batch_size,
            max_messages=opts.max_messages, poll_coalesce=opts.poll_coalesce_seconds,
            handler_timeout=opts.handler_timeout_seconds,
        )
        self._pool = HandlerPool(self._s, self._inflight, handler,
                                 retry_backoff=opts.retry_backoff_seconds,
                                 retry_backoff_max=opts.retry_backoff_max_seconds)
        self._settler = Settler(self._s, self._inflight, self._pool,
                                ack_batch_size=opts.ack_batch_size,
                                ack_flush_interval=opts.ack_flush_interval_seconds)
        self._pool.settler = self._settler
        self._poller = Poller(self._s, self._inflight, self._pool,
                              idle_timeout=opts.idle_timeout_seconds)
        self._wakeup = Wakeup()
        self._started = False
        self._finished = False  # under the shared Condition
        #: handlers still running when run() returned (past the shutdown timeout)
        self.unfinished = 0

    def __repr__(self) -> str:
        return f"Listener({self._consumer!r}, max_workers={self._max_workers})"

    # -- control -----------------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> None:
        """Ask ``run()`` to stop gracefully and return at once. Idempotent; safe from any
        thread and from a signal handler (takes no lock). ``timeout`` replaces the
        ``shutdown_timeout_seconds`` given running handlers. Use :meth:`join` to wait."""
        if timeout is not None:
            self._shutdown_timeout = timeout
        self._s.stop_requested = True
        self._wakeup.notify()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until ``run()`` has returned (never call it from a signal handler);
        ``timeout`` in seconds of the consumer's clock."""
        with self._s.cond:
            return wait_for(self._clock, self._s.cond, lambda: self._finished, timeout)

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for (handlers may check it to finish early)."""
        return self._s.stop_requested

    @property
    def refresher(self) -> LeaseRefresher:
        return self._refresher

    def stuck_handlers(self) -> dict[str, float]:
        """Handlers running past ``handler_timeout_seconds`` now: message id -> seconds
        since the handler was called (for health checks)."""
        return self._inflight.stuck_handlers()

    def run(self) -> None:
        """Consume until stopped; every thread started here is joined before return."""
        if self._started:
            raise RuntimeError("a Listener runs only once; make a new one")
        self._started = True
        restore = self._install_signal_handlers()
        try:
            self._start_threads()
            # With signal handlers, look again each second anyway: on_signal runs only
            # when the main thread runs Python code (the wakeup fd should see to that).
            check = 0.1 if self._stop_event is not None else (
                SIGNAL_CHECK_S if self._install_signals else None)
            while not self._s.stop_requested:
                if self._stop_event is not None and self._stop_event.is_set():
                    log.info("listener %s: stop event set", self._name)
                    break
                self._wakeup.wait(check)
        finally:
            try:
                self._shutdown()
            finally:
                restore()
                self._wakeup.close()
                with self._s.cond:
                    self._finished = True
                    self._s.cond.notify_all()

    # -- startup and shutdown ----------------------------------------------------------

    def _install_signal_handlers(self) -> Any:
        if not self._install_signals:
            return lambda: None

        def on_signal(signum: int, frame: object) -> None:
            self.stop()

        restore = install_stop_handlers(on_signal, self._wakeup)
        if restore is None:
            log.warning("listener %s: not in the main thread; no signal handlers", self._name)
            return lambda: None
        return restore

    def _start_threads(self) -> None:
        self._refresher.start()
        self._pool.start()
        self._settler.start()
        self._poller.start()
        log.info(
            "listening on %s with %d worker(s) as %s",
            ", ".join(self._consumer.topics), self._max_workers, self._consumer.id,
        )

    def _shutdown(self) -> None:
        """dramatiq's order: stop claiming, release unstarted, let handlers finish with
        their leases renewed, flush settlements, stop the refresher, join."""
        s, clock, futures = self._s, self._clock, self._pool.futures
        deadline = clock.monotonic() + max(self._shutdown_timeout, 0.0)
        with s.cond:
            s.stopping = True
            s.stop_requested = True
            unstarted = list(futures)
            s.cond.notify_all()
        for fut in unstarted:
            fut.cancel()  # its done-callback releases the message at once
        self._poller.join()  # at most one poll in flight (store timeouts bound it)
        running = self._wait_for_handlers(deadline)
        not_done = {f for f in running if not f.done()}
        with s.cond:
            # handlers past their timeout were given up on already: not waited for
            abandoned = {f for f, m in futures.items()
                         if (r := self._inflight.running.get(m)) is not None
                         and r.timed_out and f not in running and not f.done()}
        if abandoned:
            with s.cond:
                ids = [futures[f].id for f in abandoned if f in futures]
            log.warning("listener %s: %d handler(s) past handler_timeout_seconds still "
                        "running; not waited for: %s", self._name, len(ids), ", ".join(ids))
        if not_done:
            with s.cond:
                stuck = [futures[f] for f in not_done if f in futures]
            log.warning(
                "listener %s: %d handler(s) still running after the shutdown timeout; "
                "their leases are no longer renewed and will expire: %s",
                self._name, len(stuck), ", ".join(m.id for m in stuck),
            )
            for msg in stuck:
                self._refresher.untrack(msg)
        self.unfinished = len(not_done) + len(abandoned)
        self._settler.close()
        self._pool.shutdown(wait=not (not_done or abandoned))
        self._refresher.stop()  # last: leases stay renewed until everything is settled
        # segments of packed topics held with no message out go back now (their
        # reserved deliveries taken back), not after a visibility timeout: for listen(),
        # drain() (process_topic's tasks) and workers alike
        self._consumer.give_back()
        st = self.stats
        log.info(
            "listener %s stopped: %d processed, %d failed, %d dead-lettered, %d lost, "
            "%d released", self._name, st.processed, st.failed, st.dead_lettered, st.lost,
            st.released,
        )

    def _wait_for_handlers(self, deadline: float) -> set[Future[None]]:
        """Wait until ``deadline`` for the running handlers not past their timeout;
        those waited for."""
        s, clock = self._s, self._clock
        with s.cond:
            running = {f for f, m in self._pool.futures.items()
                       if (r := self._inflight.running.get(m)) is None or not r.timed_out}
            if running:
                log.info("listener %s: waiting up to %.1f s for %d handler(s)", self._name,
                         max(deadline - clock.monotonic(), 0.0), len(running))
                wait_for(clock, s.cond, lambda: all(f.done() for f in running),
                         max(deadline - clock.monotonic(), 0.0))
        return running
