"""The chaos suite's worker pool: a subprocess running ``WorkerPool`` with the recording
handler, and the harness's handle on it (child pids, kill -9 of one, graceful stop).

    python -m benchmarks.chaos.pool SPEC.json

SPEC: ``{"config": {...}, "topics": [...], "processes": N, "threads": N,
"listener_options": {...}}``; the handler's behaviour comes from the environment
(:mod:`benchmarks.chaos.handler`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

from benchmarks.chaos.ledger import LedgerWriter

__all__ = ["HANDLER", "PoolHandle", "child_pids"]

HANDLER = "benchmarks.chaos.handler:handle"
#: Pool settings for chaos runs: children restarted fast after a kill.
POOL_OPTIONS = {
    "consumer_name": "chaos",
    "shutdown_timeout_seconds": 15.0,
    "restart_backoff_seconds": 0.2,
    "restart_backoff_max_seconds": 2.0,
}
#: Listener settings: failed handlers retried soon (poison reaches its limit quickly).
LISTENER_OPTIONS = {"retry_backoff_seconds": 0.2, "retry_backoff_max_seconds": 1.0}


def child_pids(pid: int) -> list[int]:
    """The worker children of the pool process ``pid`` (not multiprocessing's helpers)."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.extend(int(p) for p in children.read_text().split())
    workers = []
    for child in found:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline or b"forkserver" in cmdline:
            workers.append(child)
    return sorted(set(workers))


class PoolHandle:
    """A running pool subprocess (its own session, so it can be killed as a group)."""

    def __init__(self, proc: subprocess.Popen[bytes], ledger: LedgerWriter) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._ledger = ledger
        self.kills = 0

    def child_pids(self) -> list[int]:
        return child_pids(self.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_child(self, rng: random.Random,
                   among: Collection[int] | None = None) -> int | None:
        """SIGKILL one worker child chosen by ``rng`` (only among the pids ``among``
        when given); its pid, or None if none runs."""
        pids = [p for p in self.child_pids() if among is None or p in among]
        if not pids:
            return None
        victim = rng.choice(pids)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self.kills += 1
        self._ledger.write("kill", pid=victim)
        return victim

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (a graceful stop), wait; SIGKILL the whole group after ``timeout``."""
        if self.proc.poll() is None:
            self._ledger.write("stop", pid=self.pid)
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait()
        # children of a killed parent: never leave one behind
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        return self.proc.returncode


def main(argv: list[str]) -> int:
    from pawn_queue_sync.workers import WorkerPool

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    spec = json.loads(Path(argv[0]).read_text())
    pool = WorkerPool(
        spec["config"], spec["topics"], HANDLER,
        processes=spec["processes"], threads=spec["threads"],
        listener_options=spec.get("listener_options") or LISTENER_OPTIONS,
        **POOL_OPTIONS,
    )
    return pool.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
