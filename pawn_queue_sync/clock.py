"""Time as a dependency: the real clock and a virtual one for tests.

Everything that reads time or waits with a timeout does so through a :class:`Clock`:
``now()``, ``monotonic()``, ``sleep()``, and ``wait(cond, timeout)`` (a
:class:`threading.Condition` wait whose timeout is measured on the clock). With the
machine's clock (:data:`SYSTEM_CLOCK`) these are the standard library's calls. With a
:class:`FakeClock` time is virtual: it moves when a test says so (``advance``), or,
with ``auto=True``, by itself whenever the threads waiting on it are all that is left
to run (see :class:`FakeClock`), so a test of threads that wait for seconds runs in
milliseconds and sees the same orderings.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Protocol

__all__ = ["Clock", "SystemClock", "FakeClock", "SYSTEM_CLOCK", "wait_for"]

log = logging.getLogger(__name__)


class Clock(Protocol):
    """What the protocol code and the runtime need from time."""

    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes back."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread."""

    def wait(self, cond: threading.Condition, timeout: float | None) -> bool:
        """``cond.wait(timeout)`` with ``timeout`` in this clock's seconds: the caller
        holds ``cond``; returns when notified (True) or once ``timeout`` has passed on
        this clock (False). Like ``Condition.wait``, it may return early: callers
        re-check their predicate."""


def wait_for(clock: Clock, cond: threading.Condition, predicate: Callable[[], bool],
             timeout: float | None) -> bool:
    """``cond.wait_for(predicate, timeout)`` on ``clock`` (the caller holds ``cond``):
    the predicate's last value."""
    deadline = None if timeout is None else clock.monotonic() + timeout
    while not (result := predicate()):
        if deadline is None:
            clock.wait(cond, None)
            continue
        left = deadline - clock.monotonic()
        if left <= 0:
            break
        clock.wait(cond, left)
    return result


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, cond: threading.Condition, timeout: float | None) -> bool:
        return cond.wait(None if timeout is None else max(timeout, 0.0))


class _Waiter:
    """A thread in :meth:`FakeClock.wait`: its condition and its virtual deadline."""

    __slots__ = ("cond", "deadline", "thread")

    def __init__(self, cond: threading.Condition, deadline: float) -> None:
        self.cond = cond
        self.deadline = deadline
        self.thread = threading.current_thread()


class FakeClock:
    """A virtual clock: it moves when told to (:meth:`advance`), when slept on
    (manual mode), or by itself (``auto=True``).

    **Manual mode** (the default): ``sleep(s)`` advances the clock by ``s``;
    ``advance(s)`` wakes every :meth:`wait` whose deadline it passed. Single-threaded
    protocol tests drive time step by step. Nothing else moves it: code that waits for
    time to pass on it (a listener's idle timeout, retry backoffs, ``drain()``, a
    shutdown wait) waits until the test advances the clock, however long that takes in
    real time. A wait with a timeout that has stood still for ``stall_warning_seconds``
    of real time is logged (a warning, once per wait), so a test that forgot to move
    the clock (or meant ``auto=True``) says so instead of hanging silently.

    **Auto mode** (``auto=True``, for code running threads, such as a listener): a
    daemon thread (``fake-clock``) advances time to the earliest deadline of the
    threads in :meth:`wait` or :meth:`sleep`, and only when nothing else can happen
    first, which is when

    * no thread has called the clock for ``quiet_seconds`` of real time, twice in a row
      (the advancing thread pauses between the two looks, so a thread the OS had
      preempted runs and calls the clock again first), and
    * every thread that has waited on the clock is waiting on it again (or has ended).
      A thread that left its wait ``hold_seconds`` of real time ago and has not come
      back is taken to be blocked on something else (a test's event, a lock) and no
      longer held for.

    So virtual time never jumps over work that a woken thread still has to do, and a
    wait of 30 virtual seconds costs a few milliseconds. The thread ends by itself a
    second after the last wait (the next wait starts another). Orderings are those the real
    clock allows (time passes while threads are blocked); only their durations shrink.
    :meth:`close` stops the thread (also a context manager).
    """

    def __init__(self, start: datetime | None = None, *, auto: bool = False,
                 quiet_seconds: float = 0.01, hold_seconds: float = 1.0,
                 stall_warning_seconds: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._t = 0.0
        self._origin = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        self._auto = auto
        self._quiet = quiet_seconds
        self._hold = hold_seconds
        self._stall_warning = stall_warning_seconds
        self._waiters: set[_Waiter] = set()
        #: threads that have waited on the clock -> real time they left their last wait
        #: (None while in a wait)
        self._participants: dict[threading.Thread, float | None] = {}
        self._active_at = time.monotonic()
        self._advancer: threading.Thread | None = None
        #: the last activity a look found quiet: a jump needs two looks in a row to find
        #: the same quiet (a thread preempted by the OS between two clock calls looks
        #: quiet to the first look; let run in between, it calls the clock again)
        self._seen_quiet: float | None = None
        self._closed = False
        #: open :meth:`held` blocks: while any is, auto mode does not move time
        self._holds = 0

    def __repr__(self) -> str:
        return f"FakeClock(t={self._t:.3f}, auto={self._auto})"

    # -- reading ---------------------------------------------------------------------------

    def now(self) -> datetime:
        with self._lock:
            self._active_at = time.monotonic()
            return self._origin + timedelta(seconds=self._t)

    def monotonic(self) -> float:
        with self._lock:
            self._active_at = time.monotonic()
            return self._t

    # -- moving ------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake the waits it made due."""
        with self._lock:
            self._t += max(0.0, seconds)
            self._active_at = time.monotonic()
            due = self._due(time.monotonic())
        _wake(due)

    def sleep(self, seconds: float) -> None:
        """Manual mode: advance by ``seconds``. Auto mode: block until the clock has
        moved ``seconds`` on (as :meth:`wait` does)."""
        if not self._auto:
            self.advance(max(0.0, seconds))
            return
        cond = threading.Condition()
        with cond:
            deadline = self.monotonic() + max(0.0, seconds)
            while (left := deadline - self.monotonic()) > 0:
                self.wait(cond, left)

    def wait(self, cond: threading.Condition, timeout: float | None) -> bool:
        """``cond.wait`` until notified (True) or ``timeout`` virtual seconds (False)."""
        me = threading.current_thread()
        with self._lock:
            self._active_at = time.monotonic()
            if timeout is not None and timeout <= 0:
                return False
            # A timeout too small to move the clock (t + timeout == t in floating point)
            # still waits for the next instant: returning at once would have a caller
            # that waits for its deadline spin, and time never move (it moves only
            # when every waiter waits).
            deadline = (float("inf") if timeout is None
                        else max(self._t + timeout, math.nextafter(self._t, math.inf)))
            waiter = _Waiter(cond, deadline)
            self._waiters.add(waiter)
            self._participants[me] = None
            self._start_advancer()
        try:
            # Woken by a notify, by advance() or the advancer (both notify ``cond``
            # after moving time, under ``cond``: no wakeup is lost), or, as a safety
            # net only, after a real second (sooner for the stall warning).
            started = time.monotonic()
            warn = not self._auto and deadline != float("inf")
            while True:
                step = 1.0
                if warn:
                    step = min(step, max(started + self._stall_warning - time.monotonic(),
                                         0.001))
                notified = cond.wait(step)
                with self._lock:
                    if self._t >= deadline:
                        return False
                    now = self._t
                if notified:
                    return True
                if warn and time.monotonic() - started >= self._stall_warning:
                    warn = False
                    log.warning(
                        "manual FakeClock at t=%.3f: thread %r has waited %.1f s of real "
                        "time for virtual time to reach %.3f; only advance() or sleep() "
                        "move this clock (or use FakeClock(auto=True))",
                        now, me.name, time.monotonic() - started, deadline)
        finally:
            with self._lock:
                self._waiters.discard(waiter)
                self._participants[me] = self._active_at = time.monotonic()

    # -- auto mode -----------------------------------------------------------------------------

    def _start_advancer(self) -> None:
        """(Under the lock.) Start the advancing thread on the first wait, auto mode."""
        if self._auto and self._advancer is None and not self._closed:
            self._advancer = threading.Thread(target=self._advance_loop, name="fake-clock",
                                              daemon=True)
            self._advancer.start()

    def _advance_loop(self) -> None:
        idle_since: float | None = None
        while True:
            time.sleep(self._quiet / 2)
            real = time.monotonic()
            with self._lock:
                if self._waiters:
                    idle_since = None
                elif idle_since is None:
                    idle_since = real
                if self._closed or (idle_since is not None and real - idle_since > 1.0):
                    self._advancer = None  # nobody waits: end (the next wait starts one)
                    return
                due = self._next_jump(real)
            _wake(due)

    def _next_jump(self, real: float) -> list[_Waiter]:
        """(Under the lock.) Jump to the earliest deadline if nothing else can run; the
        waiters it made due."""
        if self._holds or not self._waiters or real - self._active_at < self._quiet:
            self._seen_quiet = None
            return []
        if self._seen_quiet != self._active_at:
            self._seen_quiet = self._active_at  # quiet once: look again after a pause
            return []
        for thread, left_at in list(self._participants.items()):
            if not thread.is_alive():
                del self._participants[thread]
            elif left_at is not None and real - left_at < self._hold:
                return []  # woken, still running: let it reach its next wait first
        earliest = min(w.deadline for w in self._waiters)
        if earliest == float("inf"):
            return []
        self._t = max(self._t, earliest)
        self._active_at = real
        return self._due(real)

    def _due(self, real: float) -> list[_Waiter]:
        """(Under the lock.) The waiters past their deadline; each counts as running
        from now (so the next jump waits for it to wait again)."""
        due = [w for w in self._waiters if w.deadline <= self._t]
        for w in due:
            self._participants[w.thread] = real
        return due

    def waiting(self) -> int:
        """How many threads are in :meth:`wait` or :meth:`sleep` on this clock now."""
        with self._lock:
            return len(self._waiters)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Auto mode: time does not move inside this block, whatever the threads do, so a
        test can start several threads and see them all waiting (:meth:`waiting`)
        before the first jump: the order of their wake-ups is then the order of their
        deadlines, however the OS schedules them. Nests; manual mode ignores it."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                self._active_at = time.monotonic()

    def close(self) -> None:
        """Stop the advancing thread (auto mode); waits then end only when notified or
        advanced by hand."""
        with self._lock:
            self._closed = True
            advancer = self._advancer
            self._advancer = None
        if advancer is not None and advancer is not threading.current_thread():
            advancer.join()

    def __enter__(self) -> FakeClock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wake(waiters: list[_Waiter]) -> None:
    """Notify each waiter's condition (outside the clock's lock: a thread holding a
    condition may be calling the clock). A condition held elsewhere for long is left
    alone: its holder may itself wait for time to move; the waiter then sees the new
    time at its next look (within a real second)."""
    for cond in {id(w.cond): w.cond for w in waiters}.values():
        if cond.acquire(timeout=0.05):
            try:
                cond.notify_all()
            finally:
                cond.release()


SYSTEM_CLOCK = SystemClock()
