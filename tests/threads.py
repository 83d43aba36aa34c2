"""Thread helpers shared by the runtime tests: run a blocking call on a thread, join it
with a deadline, and wait for a condition without a fixed sleep.

Tests on a virtual clock (``FakeClock(auto=True)``) pass it to :func:`wait_until` when
what they wait for needs time to pass (a lease to go stale) while no other thread may
be waiting on the clock: the pauses between looks are then slept on the clock, which
moves it on. The deadline is always real time: fail, never hang."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pawn_queue_sync.clock import Clock

#: Seconds any wait may take before the test fails instead of hanging.
DEADLINE = 90.0


def run_in_thread(fn: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=fn, name="test-runner", daemon=True)
    thread.start()
    return thread


def join(thread: threading.Thread, timeout: float = DEADLINE) -> None:
    thread.join(timeout)
    assert not thread.is_alive(), f"{thread.name} did not finish within {timeout} s"


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE,
               clock: Clock | None = None) -> None:
    """Look at ``predicate`` every 0.02 s (on ``clock`` if given) until it holds; fail
    after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if clock is None:
            time.sleep(0.02)
        else:
            clock.sleep(0.02)
