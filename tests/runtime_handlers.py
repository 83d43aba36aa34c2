"""Importable handlers for worker processes started by tests/test_runtime.py.

Each records every delivery as lines appended to ``$PAWNQ_TEST_RECORD_DIR/<pid>.log``
(one ``O_APPEND`` write per line, so lines from threads never interleave):
``start <message id> <delivery count>`` before the work and ``done <message id>`` after.
``$PAWNQ_TEST_SLEEP`` (seconds) simulates work.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

_fd: int | None = None
_fd_pid: int | None = None
_lock = threading.Lock()


def _write(line: str) -> None:
    global _fd, _fd_pid
    with _lock:
        if _fd is None or _fd_pid != os.getpid():
            path = os.path.join(os.environ["PAWNQ_TEST_RECORD_DIR"], f"{os.getpid()}.log")
            _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _fd_pid = os.getpid()
        fd = _fd
    os.write(fd, line.encode())


def record(msg: Any) -> None:
    """Record the delivery, sleep ``$PAWNQ_TEST_SLEEP`` seconds, record completion."""
    _write(f"start {msg.id} {msg.delivery_count}\n")
    time.sleep(float(os.environ.get("PAWNQ_TEST_SLEEP", "0")))
    _write(f"done {msg.id}\n")


def read_records(directory: str) -> dict[int, list[tuple[str, str]]]:
    """pid -> [(event, message id)] in the order each process wrote them."""
    out: dict[int, list[tuple[str, str]]] = {}
    for name in os.listdir(directory):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(directory, name)) as f:
            out[int(name[:-4])] = [tuple(line.split()[:2]) for line in f if line.strip()]
    return out


not_callable = 42
