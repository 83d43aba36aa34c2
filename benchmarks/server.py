"""A SeaweedFS server of the benchmark's own, on loopback, for the length of a run.

The one SeaweedFS launcher of the project, :func:`tests.seaweedfs.start_seaweedfs`,
starts it (the tests use the same): ports picked free with their gRPC twins, readiness
by a real round trip, an identities file so signatures are checked, SIGTERM then
SIGKILL to stop. This module adds what a benchmark needs on top: the version, the
server's CPU time, and a scratch directory removed at the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.seaweedfs import start_seaweedfs, weed_binary
from tests.servers import ACCESS_KEY, SECRET_KEY, S3Server

__all__ = [
    "ACCESS_KEY", "SECRET_KEY", "SeaweedServer", "process_cpu_seconds", "weed_version",
]

log = logging.getLogger(__name__)


def weed_version(binary: str | os.PathLike[str] | None = None) -> str:
    try:
        out = subprocess.run(
            [str(binary or weed_binary()), "version"], capture_output=True, text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return "unknown"
    first = out.strip().splitlines()[0] if out.strip() else "unknown"
    return first.replace("version ", "", 1).strip()


class SeaweedServer:
    """``weed mini`` on 127.0.0.1 (admin credentials ``ACCESS_KEY``/``SECRET_KEY``);
    use as a context manager."""

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        self.startup_timeout = startup_timeout
        self.dir: str | None = None
        self._server: S3Server | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("SeaweedServer is not started")
        return self._server.endpoint_url

    @property
    def pid(self) -> int | None:
        return self._server.pid if self._server else None

    def version(self) -> str:
        return weed_version()

    def start(self) -> SeaweedServer:
        self.dir = tempfile.mkdtemp(prefix="pqs-bench-weed-")
        try:
            self._server = start_seaweedfs(Path(self.dir), ready_timeout=self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        log.info("SeaweedFS %s on %s (pid %s)", self.version(), self.endpoint, self.pid)
        return self

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the server process so far (Linux /proc)."""
        return process_cpu_seconds(self.pid) if self.pid else None

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process, from /proc/PID/stat (None where unavailable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / ticks
