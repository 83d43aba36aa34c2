"""Machine facts recorded with each run: CPU, memory, versions of both libraries and
their botocore, the server, load and niceness, and a fingerprint of the library's
sources (to see whether the core changed while the benchmark ran)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.server import SeaweedServer, weed_version
from benchmarks.settings import ROOT


def machine(pq_python: str, server: SeaweedServer | None) -> dict[str, Any]:
    import platform

    import boto3
    import botocore

    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    pq_versions = subprocess.run(
        [pq_python, "-c", "import importlib.metadata as m; print(' '.join(m.version(p) for p in "
         "('pawn-queue','aioboto3','aiobotocore','boto3','botocore')))"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()
    from pawn_queue_sync import __version__ as ours_version

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "pawn_queue_sync": ours_version,
        "boto3": boto3.__version__,
        "botocore": botocore.__version__,
        "pawn_queue": dict(zip(["pawn-queue", "aioboto3", "aiobotocore", "boto3", "botocore"],
                               pq_versions)),
        "seaweedfs": server.version() if server else weed_version(),
        "server": "own SeaweedFS `weed mini` on 127.0.0.1" if server else "given endpoint",
        "loadavg_start": os.getloadavg(),
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        "git_head": _git("rev-parse", "--short", "HEAD"),
        "core_uncommitted_files": len(_git("status", "--porcelain", "pawn_queue_sync")
                                      .splitlines()),
        "core_fingerprint_start": core_fingerprint(),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def core_fingerprint() -> str:
    """A hash of the library's sources: if it differs between the start and the end of
    a run, the core changed while the benchmark ran (each driver imports it afresh)."""
    import hashlib

    h = hashlib.sha1()
    for path in sorted((ROOT / "pawn_queue_sync").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]
