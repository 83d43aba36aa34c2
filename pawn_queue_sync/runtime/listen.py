"""Push-mode consuming: a poll thread feeding a thread pool, with bounded prefetch.

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
once; running handlers get ``shutdown_timeout`` seconds to finish while their leases
are still renewed; pending acks are flushed and pending retries recorded; the
refresher stops last; every thread is joined.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import random
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import LeaseLostError, PawnQueueError, StorageError
from .refresher import LeaseRefresher

if TYPE_CHECKING:
    from ..queue.consumer import Consumer
    from ..queue.message import Message

log = logging.getLogger(__name__)

__all__ = ["Handler", "Listener", "ListenerStats", "describe_error"]

Handler = Callable[["Message"], Any]

#: First pause after an empty poll (doubles up to ``polling.interval_seconds``).
EMPTY_POLL_WAIT_S = 0.1
#: First pause after a failed poll (doubles up to ``POLL_ERROR_WAIT_MAX_S``).
POLL_ERROR_WAIT_S = 0.5
POLL_ERROR_WAIT_MAX_S = 30.0
#: Failing polls end an idle-bounded run only once they have failed for this long (or
#: ``idle_timeout``, if longer): a passing blip must not end a drain that found nothing.
OUTAGE_IDLE_MIN_S = 10.0
#: Pause before retrying a failed ack batch (doubles up to 10 s).
ACK_ERROR_WAIT_S = 0.2
#: Characters of error text recorded in a message (``last_error``, dead-letter reason).
ERROR_TEXT_LIMIT = 2000


@attrs.define
class ListenerStats:
    """What a listener did, per message settled. ``processed``: the handler returned
    and the message was acked (by us, or by the handler itself); ``failed``: the
    handler raised and the message went back for a retry; ``dead_lettered``: the
    handler raised on the last allowed delivery (or nacked the message itself);
    ``lost``: not settled by us, so it will be redelivered: the lease was taken over,
    or the ack was refused (LeaseLostError), given up after store errors, or failed
    with an unexpected (non-store) error; ``released``: given back unhandled (at stop),
    or released by the handler.

    ``timed_out``: handler calls that ran past ``handler_timeout_seconds`` (their
    leases were abandoned, see :class:`Listener`); such a message is also counted as
    whatever it ends as once its handler returns. ``stuck``: handlers running past
    their timeout right now (a gauge, not a total). ``ack_errors``: failed ack
    batches (each is retried after a store error, given up after any other)."""

    processed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    lost: int = 0
    released: int = 0
    polls: int = 0
    empty_polls: int = 0
    poll_errors: int = 0
    claimed: int = 0
    ack_batches: int = 0
    ack_errors: int = 0
    timed_out: int = 0
    stuck: int = 0


@attrs.define(eq=False)
class _Run:
    """A handler call under way: when it began, when to look at it next, and whether
    it has run past the handler timeout."""

    started: float
    check_at: float
    timed_out: bool = False


#: How often the main thread of a listener with signal handlers looks at its stop flag.
SIGNAL_CHECK_S = 1.0


def _call(fn: Callable[[Message], object], msg: Message) -> Exception | None:
    """``fn(msg)``; the exception it raised, or None."""
    try:
        fn(msg)
    except Exception as exc:
        return exc
    return None


def describe_error(exc: BaseException, limit: int = ERROR_TEXT_LIMIT) -> str:
    """``Type: message`` and the last frames of the traceback, at most ``limit`` chars."""
    head = f"{type(exc).__name__}: {exc}"
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)
    text = head + "\n" + "".join(frames[1:-1]).rstrip()
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


class _Wakeup:
    """A self-pipe: :meth:`notify` is safe in a signal handler (no lock is taken)."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def write_fd(self) -> int:
        """The end a signal's C handler may write to (``signal.set_wakeup_fd``)."""
        return self._w.fileno()

    def notify(self) -> None:
        with contextlib.suppress(OSError):  # full (already woken) or closed (stopped)
            self._w.send(b"x")

    def wait(self, timeout: float | None) -> None:
        import select

        try:
            select.select([self._r], [], [], timeout)
        except (OSError, ValueError):  # closed meanwhile
            return
        try:
            while self._r.recv(4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self._w.close()
        self._r.close()


class Listener:
    """Hands each message of ``consumer`` to ``handler`` on ``max_workers`` threads.

    ``run()`` blocks until stopped: :meth:`stop` (from any thread or a signal handler),
    ``stop_event`` being set, ``max_messages`` handler calls done, or ``idle_timeout``
    seconds with nothing to do. A Listener runs once.

    Nothing touches signals unless ``install_signal_handlers=True`` and ``run()`` is
    called in the main thread; then SIGTERM and SIGINT stop it gracefully and the
    previous handlers are restored when ``run()`` returns.

    Tuning: at most ``max_workers + ack_batch_size`` messages are in hand at once
    (claimed and not yet acked, dead-lettered or given back): that bounds what a
    crash can redeliver. ``poll_coalesce``: when fewer than half the workers are free,
    wait up to this long for more before polling (one poll, two LISTs, then serves
    several messages). ``retry_backoff`` doubles per delivery up to
    ``retry_backoff_max``. ``shutdown_timeout``: how long running handlers get at stop;
    one still running then is abandoned (``unfinished``), its lease left to expire.

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
    busy: ``idle_timeout`` and ``max_messages`` stop it past them, and the shutdown
    does not wait for them (they count in ``unfinished``). A handler that returns
    late is settled as usual (a failure is recorded at once, without backoff).
    """

    def __init__(
        self,
        consumer: Consumer,
        handler: Handler,
        *,
        max_workers: int = 4,
        stop_event: threading.Event | None = None,
        shutdown_timeout: float = 30.0,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        ack_batch_size: int = 100,
        ack_flush_interval: float = 0.05,
        poll_coalesce: float = 0.05,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 30.0,
        install_signal_handlers: bool = False,
        name: str | None = None,
        handler_timeout_seconds: float | None = None,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
        if max_messages is not None and max_messages < 0:
            raise ValueError(f"max_messages must be >= 0, got {max_messages!r}")
        if not 1 <= ack_batch_size <= 1000:  # DeleteObjects takes at most 1,000 keys
            raise ValueError(f"ack_batch_size must be in 1..1000, got {ack_batch_size!r}")
        if handler_timeout_seconds is not None and not handler_timeout_seconds > 0:
            raise ValueError(f"handler_timeout_seconds must be > 0 or None, got "
                             f"{handler_timeout_seconds!r}")
        self._consumer = consumer
        self._handler = handler
        self._max_workers = max_workers
        self._stop_event = stop_event
        self._shutdown_timeout = shutdown_timeout
        self._max_messages = max_messages
        self._idle_timeout = idle_timeout
        self._ack_batch_size = ack_batch_size
        self._ack_flush_interval = ack_flush_interval
        self._poll_coalesce = poll_coalesce
        self._retry_backoff = retry_backoff
        self._retry_backoff_max = retry_backoff_max
        self._handler_timeout = handler_timeout_seconds
        self._install_signals = install_signal_handlers
        self._name = name or consumer.name
        polling = consumer.context.config.polling
        self._polling = polling
        self._rng = random.Random()

        self.stats = ListenerStats()
        self._cond = threading.Condition()
        self._wakeup = _Wakeup()
        self._stop_requested = False  # plain flag: set by stop(), maybe in a signal handler
        self._stopping = False  # under _cond: the shutdown sequence has begun
        self._started = False
        self._finished = threading.Event()
        self._free = max_workers
        #: messages in hand: being claimed, queued or running, or waiting for their ack
        #: or retry; never more than ``_capacity`` (the in-flight capacity)
        self._held = 0
        self._capacity = max_workers + ack_batch_size
        self._claimed = 0  # toward max_messages
        self._idle_at_reserve = False  # nothing was in hand when the current poll began
        self._futures: dict[Future[None], Message] = {}
        #: handler calls under way (under _cond), watched by the settler for the timeout
        self._running: dict[Message, _Run] = {}
        self._acks: list[Message] = []
        self._acks_since = 0.0
        self._ack_retry_at = 0.0
        self._ack_error_wait = ACK_ERROR_WAIT_S
        self._retries: list[tuple[float, int, Message, str]] = []
        self._seq = itertools.count()
        self._settler_closing = False
        #: handlers still running when run() returned (past the shutdown timeout)
        self.unfinished = 0

        self._refresher = LeaseRefresher(
            consumer,
            polling.lease_refresh_interval_seconds,
            name=f"pawnq-refresher-{self._name}",
        )
        self._executor: ThreadPoolExecutor | None = None
        self._poll_thread: threading.Thread | None = None
        self._settle_thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Listener({self._consumer!r}, max_workers={self._max_workers})"

    # -- control -----------------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> None:
        """Ask ``run()`` to stop gracefully and return at once. Idempotent; safe from any
        thread and from a signal handler (takes no lock). ``timeout`` replaces the
        ``shutdown_timeout`` given running handlers. Use :meth:`join` to wait."""
        if timeout is not None:
            self._shutdown_timeout = timeout
        self._stop_requested = True
        self._wakeup.notify()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until ``run()`` has returned (never call it from a signal handler)."""
        return self._finished.wait(timeout)

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for (handlers may check it to finish early)."""
        return self._stop_requested

    @property
    def refresher(self) -> LeaseRefresher:
        return self._refresher

    def stuck_handlers(self) -> dict[str, float]:
        """Handlers running past ``handler_timeout_seconds`` now: message id -> seconds
        since the handler was called (for health checks)."""
        now = time.monotonic()
        with self._cond:
            return {m.id: now - r.started for m, r in self._running.items() if r.timed_out}

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
            while not self._stop_requested:
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
                self._finished.set()

    # -- startup and shutdown ----------------------------------------------------------

    def _install_signal_handlers(self) -> Callable[[], None]:
        if not self._install_signals:
            return lambda: None
        if threading.current_thread() is not threading.main_thread():
            log.warning("listener %s: not in the main thread; no signal handlers", self._name)
            return lambda: None

        def on_signal(signum: int, frame: object) -> None:
            self.stop()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        # A signal may be delivered to any thread; its C handler then writes here, which
        # wakes the main thread's wait so that on_signal runs (it runs in that thread).
        previous_fd = signal.set_wakeup_fd(self._wakeup.write_fd(), warn_on_full_buffer=False)

        def restore() -> None:
            signal.set_wakeup_fd(previous_fd)
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def _start_threads(self) -> None:
        self._refresher.start()
        self._executor = ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix=f"pawnq-handler-{self._name}"
        )
        self._settle_thread = threading.Thread(
            target=self._settle_loop, name=f"pawnq-settler-{self._name}", daemon=True
        )
        self._settle_thread.start()
        self._poll_thread = threading.Thread(
            target=self._poll_loop, name=f"pawnq-poll-{self._name}", daemon=True
        )
        self._poll_thread.start()
        log.info(
            "listening on %s with %d worker(s) as %s",
            ", ".join(self._consumer.topics), self._max_workers, self._consumer.id,
        )

    def _shutdown(self) -> None:
        """dramatiq's order: stop claiming, release unstarted, let handlers finish with
        their leases renewed, flush settlements, stop the refresher, join."""
        deadline = time.monotonic() + max(self._shutdown_timeout, 0.0)
        with self._cond:
            self._stopping = True
            self._stop_requested = True
            unstarted = list(self._futures)
            self._cond.notify_all()
        for fut in unstarted:
            fut.cancel()  # its done-callback releases the message at once
        if self._poll_thread is not None:
            self._poll_thread.join()  # at most one poll in flight (store timeouts bound it)
        with self._cond:
            # handlers past their timeout were given up on already: not waited for
            abandoned = {f for f, m in self._futures.items()
                         if (r := self._running.get(m)) is not None and r.timed_out}
            running = [f for f in self._futures if f not in abandoned]
        if running:
            log.info("listener %s: waiting up to %.1f s for %d handler(s)", self._name,
                     max(deadline - time.monotonic(), 0.0), len(running))
            _, not_done = wait_futures(running, timeout=max(deadline - time.monotonic(),
                                                            0.0))
        else:
            not_done = set()
        abandoned = {f for f in abandoned if not f.done()}
        if abandoned:
            with self._cond:
                ids = [self._futures[f].id for f in abandoned if f in self._futures]
            log.warning("listener %s: %d handler(s) past handler_timeout_seconds still "
                        "running; not waited for: %s", self._name, len(ids), ", ".join(ids))
        if not_done:
            with self._cond:
                stuck = [self._futures[f] for f in not_done if f in self._futures]
            log.warning(
                "listener %s: %d handler(s) still running after the shutdown timeout; "
                "their leases are no longer renewed and will expire: %s",
                self._name, len(stuck), ", ".join(m.id for m in stuck),
            )
            for msg in stuck:
                self._refresher.untrack(msg)
        self.unfinished = len(not_done) + len(abandoned)
        not_done = set(not_done) | abandoned
        with self._cond:
            self._settler_closing = True
            self._cond.notify_all()
        if self._settle_thread is not None:
            self._settle_thread.join()
        if self._executor is not None:
            self._executor.shutdown(wait=not not_done, cancel_futures=True)
        self._refresher.stop()  # last: leases stay renewed until everything is settled
        s = self.stats
        log.info(
            "listener %s stopped: %d processed, %d failed, %d dead-lettered, %d lost, "
            "%d released", self._name, s.processed, s.failed, s.dead_lettered, s.lost,
            s.released,
        )

    # -- poll thread -------------------------------------------------------------------

    def _wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the shutdown to begin; True if it has."""
        with self._cond:
            if not self._stopping and seconds > 0:
                self._cond.wait(seconds)
            return self._stopping

    def _reserve(self) -> int:
        """Take free worker slots for the next poll (0 when it is time to stop)."""
        per_poll = self._polling.max_messages_per_poll
        coalesce_until: float | None = None
        with self._cond:
            while True:
                if self._stopping:
                    return 0
                budget = (
                    per_poll if self._max_messages is None
                    else self._max_messages - self._claimed
                )
                room = self._capacity - self._held
                if budget <= 0:
                    if self._live() == 0:
                        log.info("listener %s: handled max_messages=%d", self._name,
                                 self._max_messages)
                        self.stop()
                        return 0
                elif self._free > 0 and room > 0:
                    n = min(self._free, per_poll, budget, room)
                    full = min(self._max_workers, per_poll, budget, room)
                    if n < (full + 1) // 2 and self._poll_coalesce > 0:
                        # few slots free: wait a moment for more, so one poll (two
                        # LISTs) serves several messages instead of one
                        now = time.monotonic()
                        if coalesce_until is None:
                            coalesce_until = now + self._poll_coalesce
                        if now < coalesce_until:
                            self._cond.wait(coalesce_until - now)
                            continue
                    self._idle_at_reserve = self._live() == 0
                    self._free -= n
                    self._held += n
                    self._claimed += n
                    return n
                self._cond.wait()

    def _live(self) -> int:
        """(Under _cond.) Messages in hand that keep the listener busy: all but those
        whose handlers ran past their timeout (given up on; they may never return)."""
        return self._held - self.stats.stuck

    def _unreserve(self, n: int) -> None:
        if n:
            with self._cond:
                self._free += n
                self._held -= n
                self._claimed -= n
                self._cond.notify_all()

    def _poll_loop(self) -> None:
        max_empty_wait = max(self._polling.interval_seconds, EMPTY_POLL_WAIT_S)
        # The fast ramp follows the tail of a burst; before the first message there is
        # none to follow, so an idle start costs one listing per interval from the start.
        empty_wait = max_empty_wait
        error_wait = POLL_ERROR_WAIT_S
        idle_since: float | None = None
        try:
            while True:
                n = self._reserve()
                if n == 0:
                    return
                started = time.monotonic()
                try:
                    msgs = self._consumer.poll(n)
                except Exception as exc:  # never fatal: log, back off, poll again
                    self._unreserve(n)
                    with self._cond:
                        self.stats.poll_errors += 1
                        busy = self._live() > 0
                    log.warning("listener %s: poll failed (retrying in %.1f s): %s",
                                self._name, error_wait, exc,
                                exc_info=not isinstance(exc, PawnQueueError))
                    # A failing poll finds nothing either: a store down for idle_timeout
                    # ends an idle-bounded run (drain) rather than hang it forever.
                    idle_since, wait = self._idle_check(
                        busy, idle_since, started, error_wait, at_least=OUTAGE_IDLE_MIN_S)
                    if wait is None or self._wait(wait):
                        return
                    error_wait = min(error_wait * 2, POLL_ERROR_WAIT_MAX_S)
                    continue
                error_wait = POLL_ERROR_WAIT_S
                msgs = self._vet(msgs)
                self._unreserve(n - len(msgs))
                with self._cond:
                    self.stats.polls += 1
                    self.stats.claimed += len(msgs)
                if msgs:
                    idle_since = None
                    empty_wait = EMPTY_POLL_WAIT_S
                    self._dispatch(msgs)
                    continue
                with self._cond:
                    self.stats.empty_polls += 1
                    # Only a poll that began with nothing in hand proves idleness: while
                    # our acks run, a listing may show messages that vanish before the
                    # claim, and such a poll comes back empty with more to come.
                    busy = self._live() > 0 or not self._idle_at_reserve
                wait = empty_wait + self._rng.uniform(0, self._polling.jitter_max_ms / 1000.0)
                idle_since, until = self._idle_check(busy, idle_since, started, wait)
                if until is None or self._wait(until):
                    return
                empty_wait = min(empty_wait * 2, max_empty_wait)
        except BaseException:
            log.exception("listener %s: poll thread crashed; stopping", self._name)
            self.stop()
            raise

    def _idle_check(
        self, busy: bool, idle_since: float | None, started: float, wait: float,
        at_least: float = 0.0,
    ) -> tuple[float | None, float | None]:
        """After a poll that found nothing (``started`` when it began): when idleness
        began, and how long to wait before the next poll; None once ``idle_timeout``
        (or ``at_least``, if longer) has passed with nothing in hand, having stopped
        the listener."""
        if self._idle_timeout is None:
            return idle_since, wait
        if busy:
            return None, wait
        idle_since = started if idle_since is None else idle_since
        timeout = max(self._idle_timeout, at_least)
        left = timeout - (time.monotonic() - idle_since)
        if left <= 0:
            log.info("listener %s: idle for %.1f s%s", self._name, timeout,
                     " (polls failing)" if at_least else "")
            self.stop()
            return idle_since, None
        return idle_since, min(wait, left)

    def _vet(self, msgs: list[Message]) -> list[Message]:
        """Renew now any lease that aged during a slow poll (claims of one poll run in
        parallel and the poll returns when the slowest is done), so no handler starts
        on a lease that may have expired; drop those found lost. The renewals run
        together on the claim pool (idle once the poll has returned): one after
        another, the first renewed would age again while the last waited."""
        ctx = self._consumer.context
        fresh_for = min(self._polling.lease_refresh_interval_seconds,
                        ctx.visibility - ctx.fence_margin())
        aged = [m for m in msgs if self._consumer.lease_age(m) >= fresh_for]
        if not aged:
            return msgs
        errors: dict[str, Exception | None]
        if len(aged) == 1:
            errors = {aged[0].id: _call(self._consumer.refresh, aged[0])}
        else:
            pool = ctx.pool("claim", self._polling.claim_threads)
            futures = {m.id: pool.submit(_call, self._consumer.refresh, m) for m in aged}
            errors = {mid: f.result() for mid, f in futures.items()}
        kept: list[Message] = []
        for msg in msgs:
            exc = errors.get(msg.id)
            if isinstance(exc, LeaseLostError):
                with self._cond:
                    self.stats.lost += 1
                log.warning("lease on %s/%s expired during a slow poll; skipped",
                            msg.topic, msg.id)
                continue
            if exc is not None:  # keep it: the refresher tries again at once
                log.warning("could not renew %s/%s after a slow poll: %s", msg.topic,
                            msg.id, exc)
            kept.append(msg)
        return kept

    def _dispatch(self, msgs: list[Message]) -> None:
        """Submit claimed messages (their slots are already taken)."""
        for msg in msgs:
            self._refresher.track(msg)
        late: list[Message] = []
        with self._cond:
            if self._stopping:
                late = msgs
                self._free += len(msgs)
                self._cond.notify_all()
            else:
                assert self._executor is not None
                for msg in msgs:
                    fut = self._executor.submit(self._work, msg)
                    self._futures[fut] = msg
                    fut.add_done_callback(self._done)
        for msg in late:  # claimed while the shutdown began: give back at once
            self._release(msg)
            self._finish()

    def _done(self, fut: Future[None]) -> None:
        """Done-callback: free the slot; a cancelled (unstarted) message is released."""
        with self._cond:
            msg = self._futures.pop(fut, None)
            self._free += 1
            self._cond.notify_all()
        if msg is None:
            return
        if fut.cancelled():
            self._release(msg)
            self._finish()
            return
        exc = fut.exception()
        if exc is not None:  # a bug in this module, not in the handler
            log.error("listener %s: worker failed on %s", self._name, msg.id,
                      exc_info=(type(exc), exc, exc.__traceback__))

    def _release(self, msg: Message) -> None:
        self._refresher.untrack(msg)
        try:
            self._consumer.release(msg)
        except Exception as exc:  # its lease will expire and it will be redelivered
            log.warning("could not release %s/%s: %s", msg.topic, msg.id, exc,
                        exc_info=not isinstance(exc, PawnQueueError))
            return
        with self._cond:
            self.stats.released += 1

    def _finish(self) -> None:
        """One message in hand is settled (acked, dead-lettered, retried, released or
        lost): it no longer counts toward the in-flight capacity."""
        with self._cond:
            self._held -= 1
            self._cond.notify_all()

    # -- handler threads ---------------------------------------------------------------

    def _work(self, msg: Message) -> None:
        kept = False
        try:
            if self._stopping:
                self._release(msg)
            elif msg.state != "leased":
                self._count_lost(msg, "before its handler started")
            else:
                kept = self._handle(msg)
        finally:
            if not kept:
                self._finish()

    def _handle(self, msg: Message) -> bool:
        """Run the handler and settle; True if the message was handed to the settler
        (ack queued or retry scheduled), which then finishes it."""
        self._begin_run(msg)
        try:
            self._handler(msg)
        except Exception as exc:
            late = self._end_run(msg)
            return self._on_failure(msg, exc, late=late)
        except BaseException:
            self._end_run(msg)
            self._release(msg)
            raise
        self._end_run(msg)
        state = msg.state
        if state == "leased":
            self._queue_ack(msg)  # counted processed once the ack has succeeded
            return True
        if state == "lost":
            self._count_lost(msg, "while its handler ran")
        else:  # the handler acked, nacked or released it itself
            self._refresher.untrack(msg)
            with self._cond:
                if state == "acked":
                    self.stats.processed += 1
                elif state == "nacked":
                    self.stats.dead_lettered += 1
                else:
                    self.stats.released += 1
        return False

    def _begin_run(self, msg: Message) -> None:
        """Note the handler call starting (its timeout counts from now)."""
        now = time.monotonic()
        timeout = self._handler_timeout
        with self._cond:
            self._running[msg] = _Run(started=now, check_at=now + (timeout or 0.0))
            if timeout is not None:
                self._cond.notify_all()  # the settler watches the deadline

    def _end_run(self, msg: Message) -> bool:
        """Note the handler call over; True if it had run past its timeout."""
        with self._cond:
            run = self._running.pop(msg, None)
            if run is None or not run.timed_out:
                return False
            self.stats.stuck -= 1
            self._cond.notify_all()  # in hand again until settled: not idle
        log.warning("listener %s: handler on %s/%s returned after %.1f s, past "
                    "handler_timeout_seconds=%g; settling it now (state %s)", self._name,
                    msg.topic, msg.id, time.monotonic() - run.started,
                    self._handler_timeout, msg.state)
        return True

    def _overdue(self, now: float) -> tuple[list[tuple[Message, float, bool]], float | None]:
        """(Under _cond.) Handler calls due for a look: newly past their timeout (True:
        counted now) or still running on (False: a reminder, at 2x, 4x, ... the
        timeout); and when the next one falls due."""
        found: list[tuple[Message, float, bool]] = []
        next_at: float | None = None
        if self._handler_timeout is None:
            return found, None
        for msg, run in self._running.items():
            if run.check_at <= now:
                ran = now - run.started
                found.append((msg, ran, not run.timed_out))
                if not run.timed_out:
                    run.timed_out = True
                    self.stats.timed_out += 1
                    self.stats.stuck += 1
                run.check_at = run.started + 2 * max(ran, self._handler_timeout)
            if next_at is None or run.check_at < next_at:
                next_at = run.check_at
        return found, next_at

    def _abandon(self, overdue: list[tuple[Message, float, bool]]) -> None:
        """(Settler thread.) Stop renewing the leases of handlers past their timeout,
        and say so; the leases expire and the messages are delivered again."""
        with self._cond:
            stuck = self.stats.stuck
        for msg, ran, first in overdue:
            if first:
                self._refresher.untrack(msg)  # waits for a renewal of it under way
                log.warning(
                    "listener %s: handler on %s/%s has run for %.1f s, past "
                    "handler_timeout_seconds=%g; its lease is no longer renewed and will "
                    "expire, then the message is delivered again (the thread cannot be "
                    "stopped and keeps its worker slot: %d of %d stuck)", self._name,
                    msg.topic, msg.id, ran, self._handler_timeout, stuck, self._max_workers)
            else:
                log.warning(
                    "listener %s: handler on %s/%s still running after %.1f s (past "
                    "handler_timeout_seconds=%g; %d of %d worker slot(s) stuck)",
                    self._name, msg.topic, msg.id, ran, self._handler_timeout, stuck,
                    self._max_workers)

    def _on_failure(self, msg: Message, exc: Exception, *, late: bool = False) -> bool:
        if msg.state != "leased":
            if msg.state == "lost":
                self._count_lost(msg, "while its handler ran")
            else:
                self._refresher.untrack(msg)
            log.warning("handler failed on %s/%s, already %s: %s", msg.topic, msg.id,
                        msg.state, exc)
            return False
        error = describe_error(exc)
        if msg.delivery_count >= self._polling.max_delivery_count:
            self._dead_letter(msg, error)
            return False
        if late:  # its lease is no longer renewed: record the attempt now, no backoff
            log.info("handler failed on %s/%s (delivery %d of %d) past its timeout: %s",
                     msg.topic, msg.id, msg.delivery_count,
                     self._polling.max_delivery_count, exc)
            with self._cond:
                self.stats.failed += 1
            self._retry(msg, error)
            return False
        delay = min(self._retry_backoff * 2 ** (msg.delivery_count - 1),
                    self._retry_backoff_max)
        delay *= self._rng.uniform(0.9, 1.1)
        log.info("handler failed on %s/%s (delivery %d of %d), retry in %.1f s: %s",
                 msg.topic, msg.id, msg.delivery_count, self._polling.max_delivery_count,
                 delay, exc)
        with self._cond:
            self.stats.failed += 1
            if not self._settler_closing:
                heapq.heappush(self._retries,
                               (time.monotonic() + delay, next(self._seq), msg, error))
                self._cond.notify_all()
                return True
        self._retry(msg, error)  # shutting down: no backoff
        return False

    def _dead_letter(self, msg: Message, error: str) -> None:
        self._refresher.untrack(msg)  # no refresh in flight while the lease is deleted
        try:
            self._consumer.nack(msg, reason=error)
        except LeaseLostError:
            self._count_lost(msg, "before it could be dead-lettered")
            return
        except Exception as exc:
            log.error("could not dead-letter %s/%s (releasing it): %s", msg.topic, msg.id,
                      exc, exc_info=not isinstance(exc, PawnQueueError))
            self._release(msg)
            return
        finally:
            self._refresher.untrack(msg)
        with self._cond:
            self.stats.dead_lettered += 1
        log.warning("dead-lettered %s/%s after %d deliveries: %s", msg.topic, msg.id,
                    msg.delivery_count, error.splitlines()[0])

    def _retry(self, msg: Message, error: str) -> None:
        self._refresher.untrack(msg)  # no refresh in flight while the lease is deleted
        if msg.state == "lost":  # taken over while waiting for its retry
            self._count_lost(msg, "while waiting for its retry")
            return
        try:
            self._consumer.retry(msg, error)
        except LeaseLostError:
            self._count_lost(msg, "before its retry was recorded")
        except Exception as exc:
            log.warning("could not record the failed attempt on %s/%s (releasing): %s",
                        msg.topic, msg.id, exc, exc_info=not isinstance(exc, PawnQueueError))
            self._release(msg)
        finally:
            self._refresher.untrack(msg)

    def _count_lost(self, msg: Message, when: str) -> None:
        self._refresher.untrack(msg)
        with self._cond:
            self.stats.lost += 1
        log.warning("lease on %s/%s was lost %s; it will be redelivered", msg.topic, msg.id,
                    when)

    # -- settler thread ----------------------------------------------------------------

    def _queue_ack(self, msg: Message) -> None:
        with self._cond:
            if not self._settler_closing:
                if not self._acks:
                    self._acks_since = time.monotonic()
                self._acks.append(msg)
                if len(self._acks) >= self._ack_batch_size:
                    self._cond.notify_all()
                return
        self._ack([msg], requeue=False)  # the settler is gone: ack right here

    def _settle_loop(self) -> None:
        try:
            while True:
                acks, retries, overdue, done = self._next_settlements()
                if overdue:
                    self._abandon(overdue)
                if acks:
                    self._ack(acks)
                for msg, error in retries:
                    self._retry(msg, error)
                    self._finish()
                if done:
                    return
        except BaseException:
            log.exception("listener %s: settler thread crashed; stopping", self._name)
            self.stop()
            raise

    def _next_settlements(
        self,
    ) -> tuple[list[Message], list[tuple[Message, str]], list[tuple[Message, float, bool]],
               bool]:
        """Block until acks or retries are due, or handlers past their timeout need a
        look; the bool says the settler may exit."""
        with self._cond:
            while True:
                now = time.monotonic()
                overdue, next_check = self._overdue(now)
                closing = self._settler_closing
                acks: list[Message] = []
                if self._acks and now >= self._ack_retry_at and (
                    closing
                    or len(self._acks) >= self._ack_batch_size
                    or now - self._acks_since >= self._ack_flush_interval
                ):
                    acks = self._acks[: self._ack_batch_size]
                    del self._acks[: self._ack_batch_size]
                    self._acks_since = now
                retries: list[tuple[Message, str]] = []
                while self._retries and (closing or self._retries[0][0] <= now):
                    _, _, msg, error = heapq.heappop(self._retries)
                    retries.append((msg, error))
                if acks or retries or overdue:
                    return acks, retries, overdue, False
                if closing and not self._acks:
                    return [], [], [], True
                timeouts = []
                if next_check is not None:
                    timeouts.append(next_check - now)
                if self._acks:
                    timeouts.append(max(self._acks_since + self._ack_flush_interval,
                                        self._ack_retry_at) - now)
                if self._retries:
                    timeouts.append(self._retries[0][0] - now)
                self._cond.wait(max(min(timeouts), 0.001) if timeouts else None)

    def _ack(self, msgs: list[Message], *, requeue: bool = True) -> None:
        """Ack a batch; each message is finished unless kept for another attempt.

        The batch leaves the refresher first (a refresh under way is waited for): a
        refresh landing after the ack deleted the lease would find it gone and turn
        the acked message into a lost one. ``ack_many`` re-proves any lease too old
        for its fence itself. Only a message the ack did delete counts as processed.

        A store error keeps the batch for another attempt after a pause (given up at
        stop). Any other exception is a bug (ours, the store's, a wrapper's) that would
        recur on every attempt, so that nothing ever went idle: it is logged with its
        traceback and the batch given up at once. Messages it left leased are not
        released (their handlers would run again at once, and the ack fail again): their
        leases are no longer renewed and expire, and they are delivered again (``lost``).
        """
        for msg in msgs:
            self._refresher.untrack(msg)
        kept: list[Message] = []
        try:
            self._consumer.ack_many(msgs)
        except LeaseLostError as exc:
            log.warning("listener %s: %s", self._name, exc)
        except StorageError as exc:
            with self._cond:
                self.stats.ack_errors += 1
                closing = self._settler_closing
                if requeue and (not closing or self._ack_error_wait < 5.0):
                    # keep them (leases renewed again) and try again after a pause
                    kept = [m for m in msgs if m.state == "leased"]
                    for msg in kept:
                        self._refresher.track(msg)
                    self._acks[:0] = kept
                    self._ack_retry_at = time.monotonic() + self._ack_error_wait
                    self._ack_error_wait = min(self._ack_error_wait * 2, 10.0)
                    log.warning("listener %s: ack of %d message(s) failed, retrying: %s",
                                self._name, len(msgs), exc)
                else:
                    log.error("listener %s: giving up acking %d message(s); they will be "
                              "redelivered: %s", self._name, len(msgs), exc)
        except Exception:
            with self._cond:
                self.stats.ack_errors += 1
            log.exception("listener %s: unexpected error acking %d message(s), not "
                          "retried; those not acked will be redelivered once their leases "
                          "expire", self._name, len(msgs))
        else:
            self._ack_error_wait = ACK_ERROR_WAIT_S
            with self._cond:
                self.stats.ack_batches += 1
        for msg in msgs:
            if msg in kept:
                continue
            if msg.state == "acked":
                with self._cond:
                    self.stats.processed += 1
            elif msg.state == "lost":
                self._count_lost(msg, "before its ack")
            elif msg.state == "leased":  # refused (not provably ours) or given up
                with self._cond:
                    self.stats.lost += 1
                log.warning("listener %s: %s/%s was not acked; its lease will expire and "
                            "it will be redelivered", self._name, msg.topic, msg.id)
            self._finish()
