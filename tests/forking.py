"""Running a piece of a test in a forked child, for the tests of what crosses a fork."""

from __future__ import annotations

import os
import select
import signal
import traceback
from collections.abc import Callable


def exit_code_of_child(pid: int, limit: float = 30.0) -> int | None:
    """The child's exit code; None (and the child killed) if it has not exited within
    ``limit`` seconds, e.g. deadlocked."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], limit)
    finally:
        os.close(fd)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return None
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def in_child(use: Callable[[], object]) -> int | None:
    """Run ``use`` in a forked child (only the forking thread exists there); its exit
    code is what ``use`` returns if that is an int (else 0), 1 if it raised (the
    traceback printed)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            result = use()
            code = result if isinstance(result, int) else 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return exit_code_of_child(pid)
