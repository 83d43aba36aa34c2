"""Thread helpers shared by the runtime tests: run a blocking call on a thread, join it
with a deadline, and wait for a condition without a fixed sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

#: Seconds any wait may take before the test fails instead of hanging.
DEADLINE = 90.0


def run_in_thread(fn: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=fn, name="test-runner", daemon=True)
    thread.start()
    return thread


def join(thread: threading.Thread, timeout: float = DEADLINE) -> None:
    thread.join(timeout)
    assert not thread.is_alive(), f"{thread.name} did not finish within {timeout} s"


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
