"""The waits of a chaos run (a mixin of :class:`benchmarks.chaos.harness.ChaosRun`):
until the pool handled every message and drained the topic, judged by progress, not
by a fixed time per message; until messages are dead-lettered."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from benchmarks.chaos.ledger import LedgerTail

if TYPE_CHECKING:
    from benchmarks.chaos.ledger import Ledger

__all__ = ["DRAIN_LOOK_SECONDS", "STALL_SECONDS", "STALL_SECONDS_QUICK", "Waits"]

#: ``wait_handled`` gives up when the pool handled nothing new for the visibility
#: timeout plus this long (full runs; STALL_SECONDS_QUICK for --quick).
STALL_SECONDS = 60.0
STALL_SECONDS_QUICK = 20.0
#: Once every id was handled, ``wait_handled`` asks whether the topic is empty this often.
DRAIN_LOOK_SECONDS = 1.0


class Waits:
    """Waiting on a run's pool; uses the run's ``settings``, ``ledger``, ``notes``,
    ``remaining()`` and ``dead_letter_ids()``."""

    settings: Any
    ledger: Ledger
    notes: dict[str, Any]

    def remaining(self) -> int:  # pragma: no cover - ChaosRun's
        raise NotImplementedError

    def dead_letter_ids(self) -> set[str]:  # pragma: no cover - ChaosRun's
        raise NotImplementedError

    def stall_seconds(self) -> float:
        """How long the pool may handle nothing new before a wait gives up: beyond the
        visibility timeout (a stale lease must come back first), STALL_SECONDS
        (STALL_SECONDS_QUICK for --quick)."""
        s = self.settings
        return s.visibility_timeout + (STALL_SECONDS_QUICK if s.quick else STALL_SECONDS)

    def wait_handled(self, ids: Iterable[str], timeout: float | None = None, *,
                     stall_seconds: float | None = None, drained: bool = True) -> bool:
        """Wait until the ledger shows an ``end`` ok for every id and (``drained``) the
        topic is empty: the pool's acks landed, and what it handled but failed to ack
        (a fault, a kill) came back and was handled again (True). Give up (False) when
        the pool made no progress for ``stall_seconds`` (default :meth:`stall_seconds`),
        or after ``timeout`` if given. Progress is an id's first ``end`` event or, once
        every id was handled, fewer messages left in the topic: a pool handling the
        same messages again and again (acks that never land) makes none.

        Progress, not a fixed time per message: a slow pool on a loaded box gets all
        the time it needs, a pool that handles nothing is given up on soon, and what it
        left is counted ``left`` (a miss) instead of hidden by the sweep."""
        waiting = set(ids)
        stall = stall_seconds if stall_seconds is not None else self.stall_seconds()
        tail = LedgerTail(self.ledger.dir)
        now = time.monotonic()
        deadline = math.inf if timeout is None else now + timeout
        last_progress = now
        next_look = now
        ended: set[Any] = set()
        fewest = math.inf
        while True:
            for ev in tail.new_events():
                if ev.get("e") == "end":
                    if ev.get("id") not in ended:
                        ended.add(ev.get("id"))
                        last_progress = time.monotonic()
                    if ev.get("outcome") == "ok":
                        waiting.discard(ev.get("id"))
            now = time.monotonic()
            if not waiting:
                if not drained:
                    return True
                if now >= next_look:
                    next_look = now + DRAIN_LOOK_SECONDS
                    left = self._left()
                    if left == 0:
                        return True
                    if left < fewest:
                        fewest, last_progress = left, now
            if now >= deadline or now - last_progress >= stall:
                self.notes["stalled_seconds"] = round(stall, 1)
                return False
            time.sleep(0.25)

    def _left(self) -> float:
        """Messages pending in the topic (infinity when the server cannot say)."""
        try:
            return self.remaining()
        except Exception:
            return math.inf

    def wait_dead_lettered(self, ids: Iterable[str], timeout: float) -> bool:
        """Wait until every id is in the topic's dead-letter prefix (False on timeout)."""
        waiting = set(ids)
        deadline = time.monotonic() + timeout
        while True:
            waiting -= self.dead_letter_ids()
            if not waiting or time.monotonic() >= deadline:
                return not waiting
            time.sleep(0.5)
