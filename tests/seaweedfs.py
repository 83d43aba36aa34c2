"""The one SeaweedFS launcher of the project: ``weed mini`` on loopback, for the tests
(the ``real_s3`` fixtures) and the benchmarks (:mod:`benchmarks.server`).

The server is a separate process in a process group of its own (killed with us on
Linux), its ports picked free with their gRPC twins and retried on another block if one
is taken meanwhile, ready only once a real S3 round trip works. It starts with an
identities file (``-s3.config``: admin, read-only and leak-check identities, see
:mod:`tests.servers`), so signatures are checked. Stopping is SIGTERM, then SIGKILL.

:func:`start_seaweedfs` is a server for one run; :class:`RestartableSeaweedFS` (the chaos
suite's) can be stopped, gracefully or with SIGKILL, and started again on the same ports
with the same data. The operating-system side (ports, process group, signals) is in
:mod:`tests.weed_process`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tests.servers import (
    ACCESS_KEY,
    LEAK_CHECK_ACCESS_KEY,
    LEAK_CHECK_SECRET_KEY,
    READONLY_ACCESS_KEY,
    READONLY_SECRET_KEY,
    SECRET_KEY,
    S3Server,
    make_client,
    unique_bucket_name,
)
from tests.weed_process import (
    ServerStartError,
    child_env,
    log_tail,
    pdeathsig_preexec,
    pick_seaweedfs_base_port,
    port_free,
    remove_grpc_sockets,
    seaweedfs_ports,
    terminate,
    weed_binary,
)

__all__ = [
    "RestartableSeaweedFS",
    "ServerStartError",
    "StartRecord",
    "pick_seaweedfs_base_port",
    "seaweedfs_identities",
    "start_seaweedfs",
    "weed_binary",
]

#: SeaweedFS actions of an identity that may do everything, and of a read-only one.
ADMIN_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")
READONLY_ACTIONS = ("Read", "List")

#: Seconds to wait for SeaweedFS to answer a real S3 round trip after launch.
SEAWEEDFS_READY_TIMEOUT = 60.0
#: Seconds ``stop()`` waits after SIGTERM before it sends SIGKILL. A ``weed mini`` holding
#: a few hundred volumes needs ~16 s to stop gracefully, and one that ran out of volumes
#: was seen to hang on SIGTERM for good; its data directory is scratch, so we don't wait.
SEAWEEDFS_STOP_TIMEOUT = 10.0
_MAX_UNIX_SOCKET_PATH = 100


def _probe_client(endpoint_url: str) -> Any:
    """Return a client for readiness probes: short timeouts, no retries."""
    return make_client(
        endpoint_url,
        Config(connect_timeout=1, read_timeout=5, retries={"mode": "standard", "max_attempts": 1}),
    )


def _probe_s3(s3: Any) -> None:
    """Do one real S3 round trip (create bucket, put, get, delete); raise if it fails."""
    bucket = unique_bucket_name("ready")
    body = b"ready?"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="probe", Body=body)
    got = s3.get_object(Bucket=bucket, Key="probe")["Body"].read()
    if got != body:
        raise ServerStartError(f"readiness probe read back {got!r}")
    s3.delete_object(Bucket=bucket, Key="probe")
    s3.delete_bucket(Bucket=bucket)


def seaweedfs_identities() -> dict[str, Any]:
    """The ``-s3.config`` identities of the test server: admin, read-only, leak check."""

    def identity(name: str, key: str, secret: str, actions: tuple[str, ...]) -> dict[str, Any]:
        return {
            "name": name,
            "credentials": [{"accessKey": key, "secretKey": secret}],
            "actions": list(actions),
        }

    return {
        "identities": [
            identity("admin", ACCESS_KEY, SECRET_KEY, ADMIN_ACTIONS),
            identity("readonly", READONLY_ACCESS_KEY, READONLY_SECRET_KEY, READONLY_ACTIONS),
            identity("leakcheck", LEAK_CHECK_ACCESS_KEY, LEAK_CHECK_SECRET_KEY, ADMIN_ACTIONS),
        ]
    }


def _write_identities(workdir: Path) -> Path:
    """Write the identities file into *workdir* (owner-only) and return its path."""
    path = workdir / "s3-identities.json"
    path.write_text(json.dumps(seaweedfs_identities(), indent=1))
    path.chmod(0o600)
    return path


def _seaweedfs_command(
    weed: Path, data_dir: Path, workdir: Path, base: int, identities: Path
) -> list[str]:
    """Return the ``weed mini`` command line for S3 port *base*."""
    cmd = [
        str(weed),
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.port={base}",
        f"-master.port={base + 1}",
        f"-volume.port={base + 2}",
        f"-filer.port={base + 3}",
        f"-s3.port.iceberg={base + 4}",
        f"-s3.port.lance={base + 5}",
        f"-admin.port={base + 6}",
        "-webdav=false",
        "-admin.ui=false",
        # No network here, and none wanted from tests.
        "-master.telemetry=false",
        # Default: PutObject to a missing bucket answers AccessDenied (it tries to create
        # the bucket) instead of NoSuchBucket as AWS does.
        "-s3.autoCreateBucket=false",
        # Every bucket is a collection with volumes of its own; the default volume count
        # (free disk / 1 GiB, 78 here) runs out after that many buckets with data.
        "-volume.max=5000",
        # Identities: signatures are checked, and a read-only identity exists.
        f"-s3.config={identities}",
    ]
    sockets = {"s3": workdir / f"s3-{base}.sock", "filer": workdir / f"filer-{base}.sock"}
    if all(len(str(path)) <= _MAX_UNIX_SOCKET_PATH for path in sockets.values()):
        cmd += [f"-s3.localSocket={sockets['s3']}", f"-filer.localSocket={sockets['filer']}"]
    return cmd


def _wait_ready(proc: subprocess.Popen[bytes], endpoint: str, deadline: float) -> Exception | None:
    """Probe *endpoint* until it serves S3 (None), *proc* exits, or *deadline* passes.

    Returns None when ready, else the last probe error.
    """
    last_error: Exception = ServerStartError("no probe made")
    probe_client = _probe_client(endpoint)  # ~0.1-1 s to create: once per attempt
    while proc.poll() is None:
        try:
            _probe_s3(probe_client)
        except (BotoCoreError, ClientError, ServerStartError) as exc:
            last_error = exc
        else:
            return None
        if time.monotonic() >= deadline:
            break
        # Wait a little between probes, but wake up at once if weed exits.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
    return last_error


@attrs.frozen
class _Running:
    """A ``weed mini`` that serves S3: its process, S3 port, data directory and log."""

    proc: subprocess.Popen[bytes]
    base: int
    data_dir: Path
    log_path: Path

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.base}"

    def stop(self, timeout: float, *, graceful: bool = True) -> None:
        """SIGTERM, SIGKILL after *timeout* s (``graceful=False``: at once); a SIGKILLed
        server's gRPC sockets are removed."""
        if terminate(self.proc, timeout, graceful=graceful):
            remove_grpc_sockets(self.base)

    def handle(self, stopper: Callable[[], None]) -> S3Server:
        return S3Server(
            "seaweedfs", self.endpoint_url, stopper, log_path=self.log_path, pid=self.proc.pid,
            readonly=(READONLY_ACCESS_KEY, READONLY_SECRET_KEY), checks_signatures=True,
        )


def _launch(workdir: Path, data_dir: Path, base: int) -> _Running:
    """Start ``weed mini`` for S3 port *base* on *data_dir* (its log appended to)."""
    identities = _write_identities(workdir)
    log_path = workdir / f"seaweedfs-{base}.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            _seaweedfs_command(weed_binary(), data_dir, workdir, base, identities),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=child_env(workdir),
            start_new_session=True,
            preexec_fn=pdeathsig_preexec(),  # only calls prctl(2)
        )
    return _Running(proc, base, data_dir, log_path)


def _serving(running: _Running, deadline: float, stop_timeout: float) -> str | None:
    """Wait until *running* serves S3 (None), or it exited (why, from its log); raises
    ServerStartError when it is still up but not serving at *deadline*."""
    try:
        ready = _wait_ready(running.proc, running.endpoint_url, deadline)
    except BaseException:
        running.stop(stop_timeout)
        raise
    if ready is None:
        return None
    log_path = running.log_path
    if running.proc.poll() is None:  # deadline passed, server still not serving
        running.stop(stop_timeout)
        raise ServerStartError(
            f"SeaweedFS on {running.endpoint_url} not ready in time "
            f"(last error: {ready!r}); log {log_path}:\n{log_tail(log_path)}"
        )
    return (
        f"P={running.base}: exited with {running.proc.returncode}; "
        f"log {log_path}:\n{log_tail(log_path, 5)}"
    )


def _start_on_free_ports(
    workdir: Path, ready_timeout: float, stop_timeout: float, attempts: int
) -> _Running:
    """Start ``weed mini`` on a free port block (another block, and a fresh data
    directory, if it exits during startup, up to *attempts* times)."""
    weed_binary()  # fail early, and clearly, without the binary
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + ready_timeout
    failures: list[str] = []
    for _ in range(attempts):
        base = pick_seaweedfs_base_port()
        data_dir = workdir / f"data-{base}"
        data_dir.mkdir()
        running = _launch(workdir, data_dir, base)
        failure = _serving(running, deadline, stop_timeout)
        if failure is None:
            return running
        failures.append(failure)
        if time.monotonic() >= deadline:
            break
    raise ServerStartError("SeaweedFS failed to start:\n" + "\n".join(failures))


def start_seaweedfs(
    workdir: Path,
    *,
    ready_timeout: float = SEAWEEDFS_READY_TIMEOUT,
    stop_timeout: float = SEAWEEDFS_STOP_TIMEOUT,
    attempts: int = 5,
) -> S3Server:
    """Start ``weed mini`` on loopback, data and log under *workdir*; return once S3 works.

    Ports are picked at random; if the server exits during startup (typically a port
    taken in the meantime) it is retried on another block, up to *attempts* times.
    """
    running = _start_on_free_ports(Path(workdir), ready_timeout, stop_timeout, attempts)
    return running.handle(lambda: running.stop(stop_timeout))


@attrs.frozen
class StartRecord:
    """How one start of a :class:`RestartableSeaweedFS` went: seconds before the launch
    that served (ports still busy, earlier launches that exited), seconds from that
    launch until S3 served, and how many ``weed`` launches it took."""

    again: bool
    ports_wait: float
    ready: float
    launches: int


class RestartableSeaweedFS:
    """A ``weed mini`` that can be stopped (gracefully or SIGKILL) and started again on
    the same ports with the same data directory, for the chaos suite.

    ``start()`` picks the ports (and returns the running server if it runs);
    ``start_again()`` waits for the old ports to be free (a dying server may hold them
    a moment) and never moves, so clients and proxies keep their endpoint. Both return
    once a real S3 round trip works. Used as a context manager it starts on entry and
    stops on exit. ``starts`` records how long each start took (:class:`StartRecord`).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        ready_timeout: float = SEAWEEDFS_READY_TIMEOUT,
        stop_timeout: float = SEAWEEDFS_STOP_TIMEOUT,
    ) -> None:
        self.workdir = Path(workdir)
        #: Where the data is, once started (``workdir/data-PORT``).
        self.data_dir: Path | None = None
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self._running: _Running | None = None
        self._base: int | None = None
        self._server: S3Server | None = None
        self.starts: list[StartRecord] = []

    def __repr__(self) -> str:
        return f"RestartableSeaweedFS(workdir={str(self.workdir)!r}, base={self._base})"

    @property
    def endpoint_url(self) -> str:
        if self._base is None:
            raise RuntimeError("SeaweedFS was never started")
        return f"http://127.0.0.1:{self._base}"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs, else None."""
        running = self._running
        return running.proc.pid if running and running.proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self) -> S3Server:
        """Start on free ports the first time; afterwards the same as ``start_again``."""
        if self._server is not None and self.running:
            return self._server
        if self._base is not None:
            return self.start_again()
        began = time.monotonic()
        running = _start_on_free_ports(self.workdir, self.ready_timeout, self.stop_timeout, 5)
        self._base, self.data_dir = running.base, running.data_dir
        self.starts.append(StartRecord(False, 0.0, time.monotonic() - began, 1))
        return self._serve(running)

    def start_again(self) -> S3Server:
        """Start on the same ports and data directory; retry while the ports are busy."""
        if self._base is None or self.data_dir is None:
            raise RuntimeError("start() first: there are no ports to start again on")
        if self.running:
            raise RuntimeError(f"SeaweedFS is still running (pid {self.pid})")
        began = time.monotonic()
        deadline = began + self.ready_timeout
        failures: list[str] = []
        while True:
            if all(port_free(port) for port in seaweedfs_ports(self._base)):
                launched = time.monotonic()
                running = _launch(self.workdir, self.data_dir, self._base)
                failure = _serving(running, deadline, self.stop_timeout)
                if failure is None:
                    ready = time.monotonic()
                    record = StartRecord(True, launched - began, ready - launched,
                                         len(failures) + 1)
                    self.starts.append(record)
                    return self._serve(running)
                failures.append(failure)
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"SeaweedFS did not start again on {self.endpoint_url}:\n"
                    + ("\n".join(failures[-3:]) or "its ports stayed busy")
                )
            time.sleep(0.2)  # a port still held by the old process or another one

    def _serve(self, running: _Running) -> S3Server:
        self._running = running
        self._server = running.handle(self.stop)
        return self._server

    def stop(self, graceful: bool = True) -> None:
        """SIGTERM and wait up to ``stop_timeout`` s, then SIGKILL; ``graceful=False``:
        SIGKILL at once (data written so far stays in the data directory)."""
        running, self._running = self._running, None
        if running is not None:
            running.stop(self.stop_timeout, graceful=graceful)

    def close(self) -> None:
        """Stop the server if it runs; the data directory is left."""
        self.stop()

    def __enter__(self) -> RestartableSeaweedFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
