"""Time as a dependency: the real clock and a virtual one for tests."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol


class Clock(Protocol):
    """What the protocol code needs from time."""

    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes back."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread."""


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to (``advance``) or when slept on."""

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._t = 0.0
        self._origin = start or datetime(2026, 1, 1, tzinfo=timezone.utc)

    def now(self) -> datetime:
        with self._lock:
            return self._origin + timedelta(seconds=self._t)

    def monotonic(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._t += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))


SYSTEM_CLOCK = SystemClock()
