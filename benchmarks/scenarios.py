"""The scenarios: publish, consume (conditional_write and csprng_verify, one and three
processes), end to end at a fixed rate, idle cost, and the cost of a poll as the
backlog grows; each measures both libraries the same way through :mod:`benchmarks.drivers`."""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.driverlib import payload
from benchmarks.drivers import DriverFailed, Drivers
from benchmarks.ops_costs import run_ops
from benchmarks.packed import packed_steps
from benchmarks.rows import sum_ops, summary_row, total_requests
from benchmarks.server import SeaweedServer
from benchmarks.settings import OURS, PQ, lib_config, polling, sizes

log = logging.getLogger("benchmarks")


class Bench:
    """One run: its sizes, buckets and topics, the seeding of backlogs, and the rows
    of each scenario (read by :func:`benchmarks.report.build`)."""

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
        self.packed: list[dict[str, Any]] = []  # issue 14's rows (benchmarks.packed)
        self.ops: list[dict[str, Any]] = []  # issue 16's rows (benchmarks.ops_costs)
        self.bucket = {OURS: "pqs-bench-ours", PQ: "pqs-bench-pawnqueue"}
        self._seeders: dict[str, Any] = {}
        self.drivers = Drivers(server, pq_python, workdir, keep=args.keep)

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
            self.drivers.drive(OURS, specs, timeout=max(120.0, n / 50.0), synced=False)
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
        row = summary_row(scenario, lib, run, published=published, processes=processes,
                          strategy=strategy, consume=consume, mode=mode, note=note)
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
                phases.append((lib, self.drivers.start(lib, [spec])))
            for lib, phase in phases:
                run = self.drivers.finish(phase, timeout=max(120.0, n / 20.0))
                label = "publish_batch(threads=16)" if lib == OURS else "asyncio.gather"
                self.summarize(scenario, lib, run, published=n, processes=1,
                               strategy="conditional_write", consume=False,
                               mode=label if mode == "batch" else "publish() loop")
        finally:
            for _, phase in phases:
                self.drivers.abort(phase)

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
                started.append((job, self.drivers.start(lib, specs)))
            for job, phase in started:
                n = job["n"]
                run = self.drivers.finish(phase, timeout=max(60.0, n / job["min_rate"]), expect=n)
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
                self.drivers.abort(phase)

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
                phases.append((lib, self.drivers.start(lib, [cons, prod])))
            for lib, phase in phases:
                run = self.drivers.finish(phase, timeout=n / rate + 60, expect=n)
                self.summarize(f"e2e_{rate:g}msg_s", lib, run, published=n, processes=1,
                               strategy="conditional_write", consume=True,
                               mode=f"1 producer at {rate:g} msg/s + 1 consumer process",
                               note="requests and CPU are the consumer's")
        finally:
            for _, phase in phases:
                self.drivers.abort(phase)

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
                run = self.drivers.drive(lib, [spec], timeout=600, synced=False)
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
                    "poll_requests_by_op": sum_ops(p["requests"] for p in ps),
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
                phases.append((lib, self.drivers.start(lib, [spec])))
            for lib, phase in phases:
                res = self.drivers.finish(phase, timeout=seconds + 120, synced=False)["results"][0]
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
                self.drivers.abort(phase)

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
            *packed_steps(self),  # issue 14: packed topics, redis-message-queue, Spark
            ("ops", lambda: run_ops(self)),  # issue 16: delayed and deduplicated messages
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

