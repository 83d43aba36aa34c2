"""Settings and helpers shared by the runtime tests.

``POLLING``: short leases, so expiry-dependent tests run in seconds: a lease is stale
3 s (+1 s grace) after its last write and renewed every second (the fence trusts 1 s).
"""

from __future__ import annotations

import subprocess

POLLING = {
    "interval_seconds": 0.5,
    "visibility_timeout_seconds": 3,
    "lease_refresh_interval_seconds": 1,
    "max_delivery_count": 3,
    "jitter_max_ms": 20,
}


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` if it still runs, and wait for it: no process outlives its test."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
