"""Helper processes of scenarios 4 and 5 (the frozen consumer, producers): starting them
against a run, and waiting on what they write.

Each runs as ``python -m benchmarks.chaos.<program>`` in the repository, with the run's
configuration (through the proxy) in a JSON file and its output in the run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.chaos.harness import REPO, ChaosRun
from tests.weed_process import pdeathsig_preexec

__all__ = ["config_file", "spawn", "wait_for"]

#: How often the waits below look again.
WAIT_POLL_SECONDS = 0.05


def config_file(chaos: ChaosRun) -> Path:
    """The run's configuration (through the proxy) as a JSON file, written once."""
    path = chaos.run_dir / "config.json"
    if not path.exists():
        path.write_text(json.dumps(chaos.config_dict()))
    return path


def spawn(chaos: ChaosRun, program: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``benchmarks.chaos.<program>`` with the run's config and ledger; its output
    goes to ``{run_dir}/{program}-{n}.log``. It dies with this process (parent-death
    signal) and is killed at the run's close if still running."""
    logs = sorted(chaos.run_dir.glob(f"{program}-*.log"))
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with (chaos.run_dir / f"{program}-{len(logs)}.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"benchmarks.chaos.{program}",
             "--config", str(config_file(chaos)), "--ledger", str(chaos.ledger.dir), *args],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, preexec_fn=pdeathsig_preexec(),
        )
    chaos.helpers.append(proc)
    return proc


def wait_for(cond: Callable[[], bool], timeout: float,
             proc: subprocess.Popen[bytes] | None = None) -> bool:
    """Wait until ``cond()`` (True), ``timeout`` passes or ``proc`` exits (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline or (proc is not None and proc.poll() is not None):
            return cond()
        time.sleep(WAIT_POLL_SECONDS)
    return True
