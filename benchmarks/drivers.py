"""Running driver processes: each measured client is a subprocess (ours in this venv,
pawn-queue in a venv of its own) that sets up, says ready, waits for go and writes its
result; see :mod:`benchmarks.driverlib` for the protocol on the driver's side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.server import SeaweedServer
from benchmarks.settings import HERE, OURS, PQ, ROOT

OURS_DRIVER = HERE / "ours_driver.py"
PQ_DRIVER = HERE / "pq_driver.py"


class DriverFailed(RuntimeError):
    pass


class Drivers:
    """Starts phases of driver processes, says go, and collects their results and ack
    rows. ``keep`` keeps each phase's work files under ``workdir``."""

    def __init__(self, server: SeaweedServer | None, pq_python: str, workdir: Path, *,
                 keep: bool = False) -> None:
        self.server = server
        self.pq_python = pq_python
        self.workdir = workdir
        self.keep = keep
        self._phase = 0
        # drivers get no AWS/pawn-queue settings (pawn-queue overlays PAWNQUEUE_* on its
        # config) and no Python path of ours; our driver finds this checkout first
        drop = ("PAWNQUEUE_", "AWS_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
        base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        base["PYTHONUNBUFFERED"] = "1"
        self.env = {OURS: dict(base, PYTHONPATH=str(ROOT)), PQ: base}

    def _cmd(self, lib: str, spec_path: Path) -> list[str]:
        if lib == OURS:
            return [sys.executable, str(OURS_DRIVER), str(spec_path)]
        return [self.pq_python, str(PQ_DRIVER), str(spec_path)]

    def start(self, lib: str, specs: list[dict[str, Any]]) -> dict[str, Any]:
        """Spawn driver processes; they set up and wait for go (see :meth:`finish`).
        Starting the next phase's drivers while this one is measured only costs their
        wait for go (a stat() every 5 ms) and saves their start-up time."""
        self._phase += 1
        sync_dir = self.workdir / f"phase-{self._phase:03d}"
        sync_dir.mkdir()
        procs = []
        logs = []
        for i, spec in enumerate(specs):
            spec = dict(spec, index=i, sync_dir=str(sync_dir),
                        out=str(sync_dir / f"result-{i}.json"))
            spec_path = sync_dir / f"spec-{i}.json"
            spec_path.write_text(json.dumps(spec))
            logf = open(sync_dir / f"driver-{i}.log", "wb")  # noqa: SIM115
            logs.append(logf)
            procs.append(subprocess.Popen(self._cmd(lib, spec_path), stdout=logf,
                                          stderr=subprocess.STDOUT, env=self.env[lib],
                                          cwd=ROOT))
        return {"lib": lib, "specs": specs, "procs": procs, "logs": logs,
                "sync_dir": sync_dir}

    @staticmethod
    def abort(phase: dict[str, Any]) -> None:
        """Kill what is left of a phase's drivers (idempotent)."""
        for p in phase["procs"]:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in phase["logs"]:
            f.close()
        phase["logs"] = []

    def finish(self, phase: dict[str, Any], *, timeout: float, expect: int | None = None,
               synced: bool = True) -> dict[str, Any]:
        """Say go and run a started phase; with ``expect``, stop its drivers once that
        many distinct message ids were acked (or at ``timeout``)."""
        try:
            return self._drive(phase["procs"], phase["specs"], phase["sync_dir"], timeout,
                               expect, synced)
        finally:
            self.abort(phase)

    def drive(self, lib: str, specs: list[dict[str, Any]], *, timeout: float,
              expect: int | None = None, synced: bool = True) -> dict[str, Any]:
        """Start and run driver processes. Returns their results and ack rows."""
        return self.finish(self.start(lib, specs), timeout=timeout, expect=expect,
                           synced=synced)

    def _drive(self, procs: list[subprocess.Popen[bytes]], specs: list[dict[str, Any]],
               sync_dir: Path, timeout: float, expect: int | None,
               synced: bool) -> dict[str, Any]:
        def check_alive() -> None:
            for i, p in enumerate(procs):
                if p.poll() is not None and p.returncode != 0:
                    tail = (sync_dir / f"driver-{i}.log").read_text(errors="replace")[-3000:]
                    raise DriverFailed(f"driver {i} exited {p.returncode}:\n{tail}")

        if synced:
            deadline = time.monotonic() + 180
            while not all((sync_dir / f"ready-{i}").exists() for i in range(len(procs))):
                check_alive()
                if time.monotonic() > deadline:
                    raise DriverFailed("drivers never became ready")
                time.sleep(0.02)
        srv0 = self.server.cpu_seconds() if self.server else None
        t_go = time.time()
        (sync_dir / "go").touch()
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        offsets = [0] * len(procs)
        if expect is not None:
            while len(seen) < expect and time.monotonic() < deadline:
                check_alive()
                time.sleep(0.05)
                for i in range(len(procs)):
                    path = sync_dir / f"acks-{i}.txt"
                    if not path.exists():
                        continue
                    with open(path) as f:
                        f.seek(offsets[i])
                        data = f.read()
                    cut = data.rfind("\n") + 1
                    offsets[i] += len(data[:cut].encode())
                    seen.update(line.split(" ", 1)[0] for line in data[:cut].splitlines())
            (sync_dir / "stop").touch()
        for i, p in enumerate(procs):
            left = max(deadline - time.monotonic(), 0) + 60
            try:
                p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise DriverFailed(f"driver {i} did not finish in time") from None
        check_alive()
        srv1 = self.server.cpu_seconds() if self.server else None
        results = []
        for i, spec in enumerate(specs):
            res = json.loads((sync_dir / f"result-{i}.json").read_text())
            res["counted"] = spec.get("counted", True)
            results.append(res)
        acks: list[tuple[str, float, float]] = []
        for i in range(len(procs)):
            path = sync_dir / f"acks-{i}.txt"
            if path.exists():
                for line in path.read_text().splitlines():
                    mid, tp, ta = line.split()
                    acks.append((mid, float(tp), float(ta)))
        server_cpu = (srv1 - srv0) if srv0 is not None and srv1 is not None else None
        if not self.keep:
            shutil.rmtree(sync_dir, ignore_errors=True)
        return {"results": results, "acks": acks, "t_go": t_go, "server_cpu": server_cpu}

