"""Side-by-side benchmark of pawn-queue-sync and pawn-queue 0.1.3 on one S3 server.

    python -m benchmarks.run            # full run: ~10 min on 2 cores, plus ~15 min
                                        # to publish and poll the 100,000 backlog
    python -m benchmarks.run --backlogs 1000,10000   # full run without the 100,000
    python -m benchmarks.run --quick    # smoke run (< 2 min on a quiet machine)
    python -m benchmarks.run --endpoint http://127.0.0.1:8333   # an existing server
    python -m benchmarks.run --nice -10 # on a machine shared with other work

Without ``--endpoint`` a SeaweedFS of its own is started on loopback and stopped at
the end. Every measured client runs in a subprocess (ours in this venv, pawn-queue in
a venv of its own, see :mod:`benchmarks.pqenv`) and counts its S3 requests with a
botocore hook; the runner starts them together, stops consumers once every published
message id has been acked, and counts each id (duplicates, losses). Results go to
``benchmarks/results/latest.json`` (``quick.json`` with ``--quick``) and a markdown
table; a full run also rewrites the tables of ``docs/performance.md``. With
``--endpoint`` the objects of the run's topics are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

from benchmarks import report
from benchmarks.driverlib import payload, quantile
from benchmarks.pqenv import pawnqueue_python
from benchmarks.server import ACCESS_KEY, SECRET_KEY, SeaweedServer, weed_version

log = logging.getLogger("benchmarks")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
OURS_DRIVER = HERE / "ours_driver.py"
PQ_DRIVER = HERE / "pq_driver.py"

OURS, PQ = "ours", "pawn-queue"


class DriverFailed(RuntimeError):
    pass


# -- sizes -----------------------------------------------------------------------------


def sizes(quick: bool) -> dict[str, Any]:
    """Message counts per scenario; pawn-queue gets fewer where it is slow (csprng_verify
    ~1 msg/s). ``--quick`` is a smoke run: tiny counts, no 3-process csprng_verify."""
    if quick:
        return {
            "publish_seq": 100, "publish_batch": 400,
            "consume_cw": {OURS: 200, PQ: 100}, "consume_cw_3": {OURS: 150, PQ: 60},
            "consume_cs": {OURS: 80, PQ: 3}, "consume_cs_3": None,
            "e2e": 30, "e2e_rate": 10.0,
            "idle_seconds": 3.0, "backlogs": [500],
        }
    return {
        "publish_seq": 2000, "publish_batch": 10000,
        "consume_cw": {OURS: 1500, PQ: 1500}, "consume_cw_3": {OURS: 1500, PQ: 1500},
        "consume_cs": {OURS: 1500, PQ: 20}, "consume_cs_3": {OURS: 3000, PQ: 30},
        "e2e": 300, "e2e_rate": 10.0,
        "idle_seconds": 12.0, "backlogs": [1000, 10000, 100000],
    }


# -- configuration given to both libraries ---------------------------------------------


def polling(max_messages: int, interval: float = 0.2) -> dict[str, Any]:
    return {
        "interval_seconds": interval,
        "max_messages_per_poll": max_messages,
        "visibility_timeout_seconds": 30.0,
        "lease_refresh_interval_seconds": 10.0,
    }


CSPRNG = {"jitter_min_ms": 100, "jitter_max_ms": 400, "verify_retries": 2,
          "verify_retry_delay_ms": 150}


def lib_config(lib: str, endpoint: str, bucket: str, strategy: str,
               poll: dict[str, Any], claim_threads: int = 16) -> dict[str, Any]:
    s3 = {
        "endpoint_url": endpoint, "bucket_name": bucket,
        "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
        "region_name": "us-east-1", "use_ssl": endpoint.startswith("https"),
    }
    cfg: dict[str, Any] = {
        "s3": s3,
        "polling": dict(poll),
        "concurrency": {"strategy": strategy, "csprng_verify": dict(CSPRNG)},
    }
    if lib == OURS:
        s3["create_bucket"] = True
        cfg["polling"]["claim_threads"] = claim_threads
        cfg["publishing"] = {"batch_threads": 16}
    return cfg


# -- running drivers -------------------------------------------------------------------


class Bench:
    def __init__(self, endpoint: str, server: SeaweedServer | None, args: argparse.Namespace,
                 pq_python: str, workdir: Path) -> None:
        self.endpoint = endpoint
        self.server = server
        self.args = args
        self.pq_python = pq_python
        self.workdir = workdir
        self.run_id = time.strftime("%m%d%H%M%S") + uuid.uuid4().hex[:4]
        self.size = sizes(args.quick)
        self.scenarios: list[dict[str, Any]] = []
        self.scaling: list[dict[str, Any]] = []
        self.idle: list[dict[str, Any]] = []
        self.bucket = {OURS: "pqs-bench-ours", PQ: "pqs-bench-pawnqueue"}
        self._phase = 0
        self._seeders: dict[str, Any] = {}
        # drivers get no AWS/pawn-queue settings (pawn-queue overlays PAWNQUEUE_* on its
        # config) and no Python path of ours; our driver finds this checkout first
        drop = ("PAWNQUEUE_", "AWS_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
        base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        base["PYTHONUNBUFFERED"] = "1"
        self.env = {OURS: dict(base, PYTHONPATH=str(ROOT)), PQ: base}

    def topic(self, name: str) -> str:
        return f"{name}-{self.run_id}"

    def cleanup(self) -> None:
        """Delete every object of this run's topics (for a server we did not start)."""
        for bucket in (*self.bucket.values(), "pqs-bench-scale"):
            store = self._seeder(bucket).store
            for prefix in store.list("", delimiter="/").prefixes:
                if prefix.rstrip("/").endswith(self.run_id):
                    keys = [o.key for o in store.list(prefix).objects]
                    store.delete_many(keys)

    def config(self, lib: str, strategy: str, max_messages: int, *, bucket: str | None = None,
               claim_threads: int = 16, interval: float = 0.2) -> dict[str, Any]:
        return lib_config(lib, self.endpoint, bucket or self.bucket[lib], strategy,
                          polling(max_messages, interval), claim_threads)

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
        if not self.args.keep:
            shutil.rmtree(sync_dir, ignore_errors=True)
        return {"results": results, "acks": acks, "t_go": t_go, "server_cpu": server_cpu}

    # -- helpers ------------------------------------------------------------------------

    def seed(self, lib: str, topic: str, n: int, *, bucket: str | None = None) -> float:
        """Publish ``n`` messages (not measured) with our publish_batch: in this process
        up to 20,000, else from 3 driver processes. pawn-queue reads the same layout.
        Returns the seconds it took."""
        if n <= 0:
            return 0.0
        bucket = bucket or self.bucket[lib]
        t0 = time.monotonic()
        if n > 20000:
            k = 3
            cfg = self.config(OURS, "conditional_write", 10, bucket=bucket)
            specs = [{"role": "publish", "mode": "batch", "threads": 16, "chunk": 2000,
                      "n": n // k + (1 if i < n % k else 0), "topic": topic, "config": cfg,
                      "wait_go": False, "name": "bench-seeder"} for i in range(k)]
            self.drive(OURS, specs, timeout=max(120.0, n / 50.0), synced=False)
        else:
            pq = self._seeder(bucket)
            pq.create_topic(topic)
            producer = pq.register_producer("bench-seeder")
            for start in range(0, n, 2000):
                producer.publish_batch(
                    topic, [payload(i) for i in range(start, min(n, start + 2000))], threads=16
                )
        return time.monotonic() - t0

    def _seeder(self, bucket: str) -> Any:
        from pawn_queue_sync import PawnQueue, load_config

        pq = self._seeders.get(bucket)
        if pq is None:
            pq = PawnQueue(load_config(self.config(OURS, "conditional_write", 10,
                                                   bucket=bucket)))
            pq.setup()
            self._seeders[bucket] = pq
        return pq

    def close(self) -> None:
        for pq in self._seeders.values():
            pq.teardown()
        self._seeders.clear()

    def summarize(self, scenario: str, lib: str, run: dict[str, Any], *, published: int,
                  processes: int, strategy: str, consume: bool, mode: str,
                  note: str = "") -> dict[str, Any]:
        results = [r for r in run["results"] if r["counted"]]
        requests: dict[str, int] = {}
        for r in results:
            for op, k in r["requests"].items():
                requests[op] = requests.get(op, 0) + k
        total_req = total_requests(requests)
        cpu = sum(r["cpu"] for r in results)
        t_go = run["t_go"]
        row: dict[str, Any] = {
            "scenario": scenario, "lib": lib, "strategy": strategy, "processes": processes,
            "mode": mode, "published": published, "note": note,
            "loadavg_1min_after": round(os.getloadavg()[0], 2),
        }
        if consume:
            acks = run["acks"]
            ids = [a[0] for a in acks]
            unique = len(set(ids))
            last = max((a[2] for a in acks), default=t_go)
            seconds = max(last - t_go, 1e-9)
            lat = [(ta - tp) * 1000.0 for _, tp, ta in acks]
            done = unique
            row.update({
                "messages": unique, "duplicates": len(ids) - unique,
                "lost": max(published - unique, 0),
                "latency_ms": {"p50": quantile(lat, 0.5), "p99": quantile(lat, 0.99)},
            })
        else:
            seconds = max(max(r["t_end"] for r in results) - t_go, 1e-9)
            done = published
            row.update({"messages": published, "duplicates": None, "lost": None,
                        "latency_ms": None})
        row.update({
            "seconds": seconds,
            "msgs_per_s": done / seconds if done else 0.0,
            "requests": requests,
            "requests_total": total_req,
            "requests_per_msg": total_req / done if done else None,
            "client_cpu_s": cpu,
            "client_cpu_ms_per_msg": 1000.0 * cpu / done if done else None,
            "server_cpu_ms_per_msg": (1000.0 * run["server_cpu"] / done
                                      if done and run["server_cpu"] is not None else None),
        })
        log.info("%-22s %-10s %6d msgs %8.1f msg/s %5.2f req/msg %6.2f ms CPU/msg",
                 scenario, lib, done, row["msgs_per_s"], row["requests_per_msg"] or 0,
                 row["client_cpu_ms_per_msg"] or 0)
        self.scenarios.append(row)
        return row

    # -- scenarios ----------------------------------------------------------------------

    def publish(self, scenario: str, mode: str, n: int) -> None:
        phases = []
        try:
            for lib in (OURS, PQ):
                topic = self.topic(f"{scenario}-{lib[:2]}")
                spec = {"role": "publish", "mode": mode, "n": n, "threads": 16,
                        "topic": topic, "config": self.config(lib, "conditional_write", 32)}
                phases.append((lib, self.start(lib, [spec])))
            for lib, phase in phases:
                run = self.finish(phase, timeout=max(120.0, n / 20.0))
                label = "publish_batch(threads=16)" if lib == OURS else "asyncio.gather"
                self.summarize(scenario, lib, run, published=n, processes=1,
                               strategy="conditional_write", consume=False,
                               mode=label if mode == "batch" else "publish() loop")
        finally:
            for _, phase in phases:
                self.abort(phase)

    def consume(self, jobs: list[dict[str, Any]]) -> None:
        """Consume scenarios: seed each one's topic, start all their drivers (they set up
        and wait), then measure them one after the other.

        A job: scenario, lib, strategy, n, processes, and optionally mode ("poll" or
        "listen"), max_messages, claim_threads, workers, min_rate (msg/s, for the
        timeout)."""
        started = []
        try:
            for job in jobs:
                job = {"mode": "poll", "max_messages": 32, "claim_threads": 16,
                       "workers": 32, "min_rate": 5.0, **job}
                lib = job["lib"]
                topic = self.topic(f"{job['scenario']}-{lib[:2]}")
                self.seed(lib, topic, job["n"])
                cfg = self.config(lib, job["strategy"], job["max_messages"],
                                  claim_threads=job["claim_threads"])
                specs = [{"role": "consume", "mode": job["mode"], "topic": topic,
                          "config": cfg, "workers": job["workers"],
                          "name": f"bench-consumer-{i}"} for i in range(job["processes"])]
                started.append((job, self.start(lib, specs)))
            for job, phase in started:
                n = job["n"]
                run = self.finish(phase, timeout=max(60.0, n / job["min_rate"]), expect=n)
                if job["lib"] == OURS:
                    label = (f"listen(max_workers={job['workers']})" if job["mode"] == "listen"
                             else "poll()+ack_many() loop")
                    label += f", claim_threads={job['claim_threads']}"
                else:
                    label = "poll()+ack() loop"
                label += f", max_messages_per_poll={job['max_messages']}"
                self.summarize(job["scenario"], job["lib"], run, published=n,
                               processes=job["processes"], strategy=job["strategy"],
                               consume=True, mode=label)
        finally:
            for _, phase in started:
                self.abort(phase)

    def e2e(self, n: int, rate: float) -> None:
        """One producer at a fixed rate and one consumer process, concurrently."""
        phases = []
        try:
            for lib in (OURS, PQ):
                topic = self.topic(f"e2e-{lib[:2]}")
                cfg = self.config(lib, "conditional_write", 32)
                cons = {"role": "consume", "mode": "listen" if lib == OURS else "poll",
                        "topic": topic, "config": cfg, "workers": 32, "name": "bench-e2e"}
                # the producer is not counted: requests and CPU reported are the consumer's
                prod = {"role": "publish", "mode": "sequential", "rate": rate, "n": n,
                        "topic": topic, "config": cfg, "name": "bench-e2e-producer",
                        "counted": False}
                phases.append((lib, self.start(lib, [cons, prod])))
            for lib, phase in phases:
                run = self.finish(phase, timeout=n / rate + 60, expect=n)
                self.summarize(f"e2e_{rate:g}msg_s", lib, run, published=n, processes=1,
                               strategy="conditional_write", consume=True,
                               mode=f"1 producer at {rate:g} msg/s + 1 consumer process",
                               note="requests and CPU are the consumer's")
        finally:
            for _, phase in phases:
                self.abort(phase)

    def scaling_run(self) -> None:
        """Cost of one poll as the backlog grows, both libraries on the same topic."""
        bucket = "pqs-bench-scale"
        topic = self.topic("scale")
        pending = 0
        for backlog in self.size["backlogs"]:
            add = backlog - pending
            took = self.seed(OURS, topic, add, bucket=bucket)
            log.info("backlog %d ready (published %d in %.0f s)", backlog, add, took)
            pending = backlog
            for lib in (OURS, PQ):
                polls = 5 if lib == OURS else (3 if backlog <= 10000 else 2)
                cfg = self.config(lib, "conditional_write", 10, bucket=bucket)
                spec = {"role": "poll_cost", "polls": polls, "max_messages": 10,
                        "topic": topic, "config": cfg, "name": f"bench-scale-{lib[:2]}"}
                run = self.drive(lib, [spec], timeout=600, synced=False)
                res = run["results"][0]
                consumed = res["n"]
                pending -= consumed
                ps = res["polls"]
                poll_req = [total_requests(p["requests"]) for p in ps]
                ack_req = [total_requests(p["ack_requests"]) for p in ps]
                msgs = sum(p["messages"] for p in ps)
                row = {
                    "lib": lib, "backlog": backlog, "polls": len(ps), "messages": msgs,
                    "requests_per_poll": sum(poll_req) / len(ps),
                    "seconds_per_poll": sum(p["seconds"] for p in ps) / len(ps),
                    "cpu_s_per_poll": sum(p["cpu"] for p in ps) / len(ps),
                    "requests_per_msg": (sum(poll_req) + sum(ack_req)) / msgs if msgs else None,
                    "poll_requests_by_op": _sum_ops(p["requests"] for p in ps),
                }
                log.info("scale %-10s backlog %6d: %.1f req/poll, %.3f s/poll, %.2f req/msg",
                         lib, backlog, row["requests_per_poll"], row["seconds_per_poll"],
                         row["requests_per_msg"] or 0)
                self.scaling.append(row)

    def idle_run(self) -> None:
        """Both libraries' idle consumers at once (separate buckets; only requests and
        CPU are measured, and each process counts its own)."""
        seconds = self.size["idle_seconds"]
        phases = []
        try:
            for lib in (OURS, PQ):
                cfg = self.config(lib, "conditional_write", 32, interval=1.0)
                spec = {"role": "idle", "seconds": seconds,
                        "topic": self.topic(f"idle-{lib[:2]}"), "config": cfg,
                        "mode": "listen", "name": "bench-idle"}
                phases.append((lib, self.start(lib, [spec])))
            for lib, phase in phases:
                res = self.finish(phase, timeout=seconds + 120, synced=False)["results"][0]
                total = total_requests(res["requests"])
                row = {"lib": lib, "seconds": seconds, "interval_seconds": res["interval"],
                       "mode": res.get("mode"), "requests": res["requests"],
                       "requests_per_interval": total / (seconds / res["interval"]),
                       "requests_per_interval_second_half": (
                           total_requests(res.get("second_half", {}))
                           / (seconds / 2 / res["interval"])),
                       "cpu_s": res["cpu"]}
                log.info("idle %-10s %.2f requests per interval", lib,
                         row["requests_per_interval"])
                self.idle.append(row)
        finally:
            for _, phase in phases:
                self.abort(phase)

    def run_all(self, checkpoint: Any = None) -> None:
        s = self.size
        steps = [
            ("publish_seq", lambda: self.publish("publish_seq", "sequential",
                                                 s["publish_seq"])),
            ("publish_batch", lambda: self.publish("publish_batch", "batch",
                                                   s["publish_batch"])),
            ("consume_cw", self._consume_cw),
            ("consume_cs", self._consume_cs),
            ("e2e", lambda: self.e2e(s["e2e"], s["e2e_rate"])),
            ("idle", self.idle_run),
            ("scaling", self.scaling_run),
        ]
        only = set(self.args.only.split(",")) if self.args.only else None
        for name, step in steps:
            if only and name not in only:
                continue
            log.info("== %s", name)
            try:
                step()
            except DriverFailed as exc:
                log.error("%s failed: %s", name, exc)
                self.scenarios.append({"scenario": name, "error": str(exc)[-2000:]})
            if checkpoint is not None:
                checkpoint()

    def _consume_cw(self) -> None:
        s = self.size
        n1, n3 = s["consume_cw"], s["consume_cw_3"]
        cw = "conditional_write"
        self.consume([
            {"scenario": "consume_1proc", "lib": PQ, "strategy": cw, "n": n1[PQ],
             "processes": 1},
            {"scenario": "consume_1proc", "lib": OURS, "strategy": cw, "n": n1[OURS],
             "processes": 1, "mode": "poll"},
            {"scenario": "consume_1proc_listen", "lib": OURS, "strategy": cw, "n": n1[OURS],
             "processes": 1, "mode": "listen"},
        ])
        self.consume([
            {"scenario": "consume_3proc", "lib": PQ, "strategy": cw, "n": n3[PQ],
             "processes": 3},
            {"scenario": "consume_3proc", "lib": OURS, "strategy": cw, "n": n3[OURS],
             "processes": 3, "mode": "listen"},
        ])

    def _consume_cs(self) -> None:
        s = self.size
        cs = "csprng_verify"
        ours = {"mode": "listen", "max_messages": 256, "claim_threads": 64, "workers": 256,
                "min_rate": 2.0}
        jobs = [
            {"scenario": "csprng_1proc", "lib": PQ, "strategy": cs, "n": s["consume_cs"][PQ],
             "processes": 1, "min_rate": 0.3},
            {"scenario": "csprng_1proc", "lib": OURS, "strategy": cs,
             "n": s["consume_cs"][OURS], "processes": 1, **ours},
        ]
        if s["consume_cs_3"]:
            jobs += [
                {"scenario": "csprng_3proc", "lib": PQ, "strategy": cs,
                 "n": s["consume_cs_3"][PQ], "processes": 3, "min_rate": 0.3},
                {"scenario": "csprng_3proc", "lib": OURS, "strategy": cs,
                 "n": s["consume_cs_3"][OURS], "processes": 3,
                 **ours, "max_messages": 128, "workers": 128},
            ]
        self.consume(jobs[:2])
        if len(jobs) > 2:
            self.consume(jobs[2:])


def total_requests(ops: dict[str, int]) -> int:
    """Requests sent; keys starting with ``!`` count error answers among them."""
    return sum(v for k, v in ops.items() if not k.startswith("!"))


def _sum_ops(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


# -- machine ---------------------------------------------------------------------------


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


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: small counts (< 2 min)")
    p.add_argument("--endpoint", help="use this S3 endpoint instead of starting SeaweedFS")
    p.add_argument("--out", type=Path, help="JSON results (default "
                   "benchmarks/results/latest.json, or quick.json with --quick)")
    p.add_argument("--doc", action=argparse.BooleanOptionalAction, default=None,
                   help="rewrite docs/performance.md with this run's tables (default: on "
                   "for a full run, off with --quick)")
    p.add_argument("--backlogs", help="comma-separated backlog sizes for the scaling run "
                   "(default 1000 with --quick, else 1000,10000,100000)")
    p.add_argument("--only", help="comma-separated steps: publish_seq,publish_batch,"
                   "consume_cw,consume_cs,e2e,idle,scaling")
    p.add_argument("--merge", action="store_true", help="keep the rows of --out that this "
                   "run does not measure again (e.g. with --only scaling)")
    p.add_argument("--nice", type=int, default=None, help="run the benchmark (server, "
                   "drivers) at this niceness, e.g. -10 on a machine shared with other work "
                   "(negative values need root); recorded in the results")
    p.add_argument("--keep", action="store_true", help="keep the drivers' work files")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out is None:
        args.out = RESULTS / ("quick.json" if args.quick else "latest.json")
    if args.doc is None:
        args.doc = not args.quick
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("botocore", "boto3", "urllib3", "pawn_queue_sync"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # stop cleanly: drivers, server, partial JSON
    if args.nice is not None:  # inherited by the server and every driver started below
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    pq_python = pawnqueue_python()
    workdir = Path(tempfile.mkdtemp(prefix="pqs-bench-"))
    with contextlib.ExitStack() as stack:
        server = None
        if args.endpoint:
            endpoint = args.endpoint
        else:
            server = stack.enter_context(SeaweedServer())
            endpoint = server.endpoint
        log.info("endpoint %s; pawn-queue python %s", endpoint, pq_python)
        info = machine(pq_python, server)
        bench = Bench(endpoint, server, args, pq_python, workdir)
        if args.backlogs:
            bench.size["backlogs"] = [int(x) for x in args.backlogs.split(",") if x]
        _make_buckets(bench)
        previous = None
        if args.merge and args.out.exists():
            previous = json.loads(args.out.read_text())

        def checkpoint() -> dict[str, Any]:
            info["loadavg_end"] = os.getloadavg()
            info["core_fingerprint_end"] = core_fingerprint()
            info["duration_s"] = round(time.monotonic() - started, 1)
            doc = report.build(bench, info, quick=args.quick, previous=previous)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(doc, indent=2, default=_json_default) + "\n")
            tmp.replace(args.out)
            return doc

        try:
            bench.run_all(checkpoint)
            if args.endpoint:
                bench.cleanup()
        finally:
            bench.close()
            doc = checkpoint()
            md = report.markdown(doc)
            print(md)
            log.info("wrote %s", args.out)
            if args.doc:
                report.write_doc(doc, ROOT / "docs" / "performance.md")
                log.info("wrote docs/performance.md")
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _make_buckets(bench: Bench) -> None:
    from pawn_queue_sync.config import load_config
    from pawn_queue_sync.storage.s3 import S3Store

    for bucket in (*bench.bucket.values(), "pqs-bench-scale"):
        cfg = load_config(bench.config(OURS, "conditional_write", 10, bucket=bucket))
        assert cfg.s3 is not None
        store = S3Store(cfg.s3)
        try:
            store.ensure_bucket(create=True)
        finally:
            store.close()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


if __name__ == "__main__":
    sys.exit(main())
