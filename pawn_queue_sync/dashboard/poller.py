"""The one poller behind every open dashboard page: the bucket's cost is bounded by it,
not by how many pages are open or how often they refresh.

A thread reads the stats (:func:`~.source.read_stats`) at most once per ``interval``
(at least :data:`MIN_INTERVAL` seconds), and only while a page asked within
``idle_after`` seconds: a dashboard nobody looks at makes no request. Pages read the
last result from memory. An action (redrive, purge) asks for a poll (:meth:`Poller.request_poll`)
without waiting for it: it comes at most :data:`MIN_INTERVAL` after the previous one, so
a run of actions shares one poll, and the bucket is never polled more than once per
:data:`MIN_INTERVAL`, whatever the actions. Dead letters are read for the
browser on demand, one topic at a time, and kept for ``interval`` as well: every page
asking for them in that time gets the same list (one fetch, however many ask at once).

Throughput: the bucket records no acks, so what is charted is the change in counts
between two polls: ``net_out`` = (backlog before - backlog after) / seconds between the
polls, where backlog = pending + in flight. It is consumption minus publishing (a topic
consumed as fast as it is published shows 0; a redrive shows as negative, the letters
coming back), and a lower bound's change when a count is not exact.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import InvalidArgument
from .security import logged_error, public_error
from .source import Reading

log = logging.getLogger(__name__)

__all__ = ["HISTORY_SECONDS", "IDLE_AFTER", "MIN_INTERVAL", "Poller"]

#: The shortest interval between two polls of the bucket, in seconds.
MIN_INTERVAL = 2.0
#: A poller stops polling when no page asked for this long (seconds).
IDLE_AFTER = 60.0
#: How far back the throughput chart goes (seconds).
HISTORY_SECONDS = 600.0
#: How long :meth:`Poller.stop` waits for an idle poller thread to end (it wakes at once).
STOP_WAIT = 5.0


class Poller:
    """Polls ``fetch`` on a thread of its own, at most once per ``interval`` while
    wanted; :meth:`snapshot` is what every page reads (no request to the bucket)."""

    def __init__(self, fetch: Callable[[], Reading], interval: float = 5.0, *,
                 letters: Callable[[str], list[dict[str, Any]]] | None = None,
                 clock: Clock = SYSTEM_CLOCK, idle_after: float = IDLE_AFTER,
                 history_seconds: float = HISTORY_SECONDS) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
                MIN_INTERVAL <= interval < float("inf")):
            raise InvalidArgument(f"the poll interval must be at least {MIN_INTERVAL} "
                                  f"seconds, not {interval!r}")
        self.interval = float(interval)
        self._fetch = fetch
        self._letters = letters
        self._clock = clock
        self._idle_after = idle_after
        self._history_seconds = history_seconds
        self._cond = threading.Condition()
        self._reading: Reading | None = None
        self._error: str | None = None
        self._polled_at: float | None = None  # monotonic, when the last poll started
        self._wanted_at = clock.monotonic()
        self._forced = False
        self._running = False
        self._stopped = False
        self._history: deque[dict[str, Any]] = deque()
        self._letter_cache: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._letter_locks: dict[str, threading.Lock] = {}
        self._letter_generation = 0  # bumped by request_poll: older fetches are stale
        self._thread: threading.Thread | None = None
        #: Polls made (each one ``fetch``), and dead-letter fetches.
        self.polls = 0
        self.letter_fetches = 0

    # -- the thread -----------------------------------------------------------------------

    def start(self) -> Poller:
        self._thread = threading.Thread(target=self._run, name="pawnq-dashboard-poller",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling, without waiting for a poll under way: one stuck on a hanging
        bucket can last minutes (each request's timeouts and retries). Its thread is a
        daemon that drops that poll's result, logs nothing and ends, and no poll starts
        after this, so a queue closed next is never polled again. An idle thread is
        woken and joined (at most :data:`STOP_WAIT` seconds)."""
        with self._cond:
            self._stopped = True
            polling = self._running
            self._cond.notify_all()
        if self._thread is not None and not polling:
            self._thread.join(timeout=STOP_WAIT)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._await_turn():
                    return
                self._forced = False
                self._running = True
                self._polled_at = self._clock.monotonic()
            failure: Exception | None = None
            try:
                reading = self._fetch()
            except Exception as exc:  # the page shows its type and a safe message
                reading, failure = None, exc
            with self._cond:
                self._running = False
                self._cond.notify_all()
                if self._stopped:  # stopped while polling: the queue may be closed
                    return
                self.polls += 1
                self._error = None if failure is None else public_error(failure)
                if reading is not None:
                    self._record(reading)
            if failure is not None:
                log.warning("dashboard poll failed: %s", logged_error(failure))

    def _await_turn(self) -> bool:
        """Wait (holding the condition) until a poll is due and wanted, or asked for;
        False once stopped."""
        while not self._stopped:
            now = self._clock.monotonic()
            wanted = now - self._wanted_at <= self._idle_after
            since = None if self._polled_at is None else now - self._polled_at
            if (self._forced and (since is None or since >= MIN_INTERVAL)) or (
                    wanted and (since is None or since >= self.interval)):
                return True
            # idle: sleep until a page or an action asks (both notify); else until due
            due = [] if since is None else [
                left for left, asked in ((self.interval - since, wanted),
                                         (MIN_INTERVAL - since, self._forced)) if asked]
            self._clock.wait(self._cond, min(due, default=None))
        return False

    def _record(self, reading: Reading) -> None:
        now = self._clock.monotonic()
        last = self._history[-1] if self._history else None
        point: dict[str, Any] = {"at": now, "server_time": reading.server_time, "topics": {}}
        for row in reading.topics:
            backlog = int(row.get("pending", 0)) + int(row.get("in_flight", 0))
            dead = int(row.get("dead_lettered", 0))
            entry: dict[str, Any] = {"backlog": backlog, "dead": dead,
                                     "exact": bool(row.get("exact", True))}
            before = last["topics"].get(row["topic"]) if last else None
            seconds = now - last["at"] if last else 0.0
            if before is not None and seconds > 0:
                entry["net_out"] = (before["backlog"] - backlog) / seconds
                entry["dead_in"] = max(0, dead - before["dead"]) / seconds
            point["topics"][row["topic"]] = entry
        self._history.append(point)
        while self._history and now - self._history[0]["at"] > self._history_seconds:
            self._history.popleft()
        self._reading = reading

    # -- what pages read ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The last poll, as the page reads it (from memory), and the throughput
        history; marks the poller wanted (it wakes if it was idle)."""
        with self._cond:
            now = self._clock.monotonic()
            idle = now - self._wanted_at > self._idle_after
            self._wanted_at = now
            if idle:
                self._cond.notify_all()
            reading = self._reading
            history = {}
            for point in self._history:
                for topic, entry in point["topics"].items():
                    if "net_out" in entry:
                        history.setdefault(topic, []).append(
                            [round(point["at"] - now, 1), round(entry["net_out"], 3),
                             round(entry["dead_in"], 3), entry["exact"]])
            return {
                "topics": reading.topics if reading else [],
                "consumers": reading.consumers if reading else [],
                "consumers_exact": reading.consumers_exact if reading else True,
                "server_time": reading.server_time if reading else None,
                "polled": reading is not None,
                "age_seconds": None if self._polled_at is None else round(now - self._polled_at, 1),
                "error": self._error,
                "interval_seconds": self.interval,
                "idle_after_seconds": self._idle_after,
                "polls": self.polls,
                "requests_last_poll": (sum(int(r.get("requests") or 0) for r in reading.topics)
                                       if reading and all("requests" in r for r in reading.topics)
                                       else None),
                "history": history,
            }

    def known_topic(self, topic: str) -> bool:
        """The topic was in the last poll (the browser reads dead letters of those only)."""
        with self._cond:
            return self._reading is not None and any(
                r["topic"] == topic for r in self._reading.topics)

    def dead_letters(self, topic: str) -> list[dict[str, Any]]:
        """The dead letters of ``topic`` for the browser: fetched at most once per
        interval, and once for every page that asks at the same time. A fetch during
        which an action asked for a poll (:meth:`request_poll`) is not kept: it may
        have listed letters the action moved or deleted."""
        if self._letters is None:
            return []
        with self._cond:
            lock = self._letter_locks.setdefault(topic, threading.Lock())
        with lock:
            with self._cond:
                cached = self._letter_cache.get(topic)
                if cached is not None and self._clock.monotonic() - cached[0] < self.interval:
                    return cached[1]
            with self._cond:
                started = self._clock.monotonic()
                generation = self._letter_generation
            letters = self._letters(topic)
            with self._cond:
                self.letter_fetches += 1
                if generation == self._letter_generation:  # no action ended meanwhile:
                    # else the list may predate it, and is not kept for other pages
                    self._letter_cache[topic] = (started, letters)
            return letters

    def wait_for_polls(self, n: int, timeout: float = 60.0) -> bool:
        """Wait until ``n`` polls have ended (at most ``timeout`` seconds of the clock)."""
        with self._cond:
            deadline = self._clock.monotonic() + timeout
            while self.polls < n:
                left = deadline - self._clock.monotonic()
                if left <= 0 or self._stopped:
                    return False
                self._clock.wait(self._cond, left)
            return True

    def request_poll(self) -> int:
        """After an action: forget cached dead letters and ask for a poll, without
        waiting for it. It starts :data:`MIN_INTERVAL` after the previous poll at the
        earliest, so every action asking before then shares it. Returns the poll count
        at which the action shows (a poll under way may have read the bucket before it:
        the one after)."""
        with self._cond:
            self._letter_cache.clear()
            self._letter_generation += 1
            self._forced = True
            self._wanted_at = self._clock.monotonic()
            self._cond.notify_all()
            return self.polls + (2 if self._running else 1)

    def refresh(self, timeout: float = 60.0) -> None:
        """:meth:`request_poll`, then wait for that poll, at most ``timeout`` seconds."""
        target = self.request_poll()
        with self._cond:
            deadline = self._clock.monotonic() + timeout
            while self.polls < target and not self._stopped:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return
                self._clock.wait(self._cond, left)
