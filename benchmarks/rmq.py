"""The redis-message-queue anchor (issue 14): redis-message-queue 11 on a local
``redis-server``, measured in the same run as the packed topics, when present.

- ``redis-server``: on PATH, or installed from Debian's package the way ``.ci/run``
  installs Java (``apt-get install redis-server``; as root, or through ``sudo -n``).
  Started here on a free loopback port, without persistence (``--save ''
  --appendonly no``): the fastest Redis, so the anchor is at its strongest.
- redis-message-queue 11 needs Python >= 3.12: its own venv under
  ``~/.cache/pawn-queue-sync/`` (like pawn-queue's, never in this project's
  dependencies), built from the first Python >= 3.12 found (``RMQ_BASE_PYTHON``,
  ``python3.13``/``python3.12`` on PATH, pyenv's versions).

If either cannot be had, the row says ``absent`` and why. The driver
(:mod:`benchmarks.rmq_driver`) publishes and then consumes with one consumer.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.server import process_cpu_seconds
from benchmarks.settings import HERE

log = logging.getLogger("benchmarks")

RMQ_SPEC = "redis-message-queue>=11.0.1,<12"
VENV = Path(os.environ.get("RMQ_VENV") or Path.home() / ".cache" / "pawn-queue-sync"
            / "redis-message-queue-11-venv")
DRIVER = HERE / "rmq_driver.py"


class Absent(RuntimeError):
    """The anchor cannot run here; the message says why."""


def _run(cmd: list[str], timeout: float = 600,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(env or os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def redis_server() -> str:
    """The path of ``redis-server``, installing Debian's package if it is missing."""
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo"):
        prefix = ["sudo", "-n"]
    else:
        raise Absent("redis-server is not on PATH and cannot be installed here "
                     "(not root, no sudo)")
    if not shutil.which("apt-get"):
        raise Absent("redis-server is not on PATH and there is no apt-get to install it")
    log.info("redis-server not found: installing Debian's redis-server package")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "redis-server"]):
        out = _run(prefix + cmd)
        if out.returncode != 0:
            raise Absent(f"redis-server is not on PATH and `{' '.join(cmd)}` failed "
                         f"(exit {out.returncode}): {out.stderr.strip()[-300:]}")
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    if not found:
        raise Absent("Debian's redis-server package installed no redis-server")
    return found


def _base_pythons() -> list[str]:
    given = os.environ.get("RMQ_BASE_PYTHON")
    out = [given] if given else []
    out += [p for p in (shutil.which(f"python3.{m}") for m in (14, 13, 12)) if p]
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        out += [str(v / "bin" / "python") for v in sorted(pyenv.iterdir(), reverse=True)
                if (v / "bin" / "python").exists()]
    return out


def _version_ok(python: str, minimum: tuple[int, int] = (3, 12)) -> bool:
    out = _run([python, "-c", "import sys; print(*sys.version_info[:2])"], timeout=30)
    if out.returncode != 0:
        return False
    major, minor = (int(x) for x in out.stdout.split())
    return (major, minor) >= minimum


def _has_rmq(python: Path) -> bool:
    if not python.exists():
        return False
    out = _run([str(python), "-c", "import importlib.metadata as m; "
                "print(m.version('redis-message-queue'))"], timeout=60)
    return out.returncode == 0 and out.stdout.strip().split(".")[0] == "11"


def rmq_python() -> str:
    """An interpreter with redis-message-queue 11, in its own venv (built on first use)."""
    python = VENV / "bin" / "python"
    if _has_rmq(python):
        return str(python)
    base = next((p for p in _base_pythons() if _version_ok(p)), None)
    if base is None:
        raise Absent("redis-message-queue 11 needs Python >= 3.12 and none was found "
                     "(set RMQ_BASE_PYTHON)")
    log.info("building a redis-message-queue 11 venv in %s from %s (once)", VENV, base)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    for cmd in ([base, "-m", "venv", "--clear", str(VENV)],
                [str(python), "-m", "pip", "install", "--quiet", RMQ_SPEC]):
        out = _run(cmd)
        if out.returncode != 0:
            raise Absent(f"could not build the redis-message-queue venv: `{' '.join(cmd)}` "
                         f"exit {out.returncode}: {out.stderr.strip()[-300:]}")
    if not _has_rmq(python):
        raise Absent(f"redis-message-queue 11 did not install in {VENV}")
    return str(python)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``redis-server`` on a free loopback port, no persistence; a context manager."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="pqs-bench-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise Absent(f"{self.binary} did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def version(self) -> str:
        out = _run([self.binary, "--version"], timeout=10).stdout
        return out.split("v=")[1].split()[0] if "v=" in out else out.strip()

    def cpu_seconds(self) -> float | None:
        return process_cpu_seconds(self.proc.pid) if self.proc else None

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_rmq(n: int, payload_bytes: int, workdir: Path) -> list[dict[str, Any]]:
    """Publish then consume ``n`` messages with redis-message-queue; two rows, or one
    ``absent`` row saying why it could not run."""
    try:
        binary = redis_server()
        python = rmq_python()
    except (Absent, OSError, subprocess.SubprocessError) as exc:
        log.warning("redis-message-queue anchor absent: %s", exc)
        return [{"scenario": "rmq_consume_1", "lib": "redis-message-queue",
                 "absent": str(exc)}]
    out = workdir / "rmq-result.json"
    spec = {"url": "", "queue": f"bench-{os.getpid()}", "n": n,
            "payload_bytes": payload_bytes, "out": str(out), "timeout": max(120, n / 20)}
    with RedisServer(binary) as server:
        spec["url"] = f"redis://127.0.0.1:{server.port}/0"
        spec_path = workdir / "rmq-spec.json"
        spec_path.write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"))}
        cpu0 = server.cpu_seconds()
        proc = _run([python, str(DRIVER), str(spec_path)], timeout=spec["timeout"] + 120,
                    env=env)
        cpu1 = server.cpu_seconds()
        version = server.version()
    if proc.returncode != 0:
        raise RuntimeError(f"rmq driver exit {proc.returncode}: {proc.stderr[-2000:]}")
    res = json.loads(out.read_text())
    load = [round(x, 2) for x in os.getloadavg()]
    server_cpu = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
    lib = f"redis-message-queue {res['versions']['redis-message-queue']}"
    how = (f"Python {res['python']}, redis-py {res['versions']['redis']}; redis-server "
           f"{version} on 127.0.0.1, no persistence; library defaults (at-least-once)")
    rows = []
    for phase, label in (("publish", "publish() loop, 1 thread"),
                         ("consume", "1 consumer: `with process_message()` loop")):
        r = res[phase]
        done = r.get("messages", n)
        rows.append({
            "scenario": f"rmq_{phase}_1", "lib": lib, "mode": f"{label}; {how}",
            "messages": done, "published": n, "seconds": r["seconds"],
            "msgs_per_s": done / r["seconds"], "client_cpu_ms_per_msg": 1000 * r["cpu"] / done,
            "redis_commands_per_msg": r["commands"] / done,
            "requests_per_msg": r["round_trips"] / done,
            "duplicates": r.get("duplicates"), "lost": r.get("lost"),
            "latency_ms": r.get("latency_ms"), "loadavg": load, "payload_bytes": payload_bytes,
            "note": "redis-server CPU over both phases: "
                    + (f"{1000 * server_cpu / n:.2f} ms/msg" if server_cpu is not None
                       else "unknown"),
        })
        log.info("%-16s %s %8.1f msg/s %5.2f round trips/msg (%.1f commands) %.3f ms CPU/msg",
                 rows[-1]["scenario"], lib, rows[-1]["msgs_per_s"],
                 rows[-1]["requests_per_msg"], rows[-1]["redis_commands_per_msg"],
                 rows[-1]["client_cpu_ms_per_msg"])
    return rows
