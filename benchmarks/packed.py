"""Issue 14's scenarios: packed topics beside plain ones, in the same run, on the same
server, with the same client settings and 1 KiB payloads.

- ``pk_publish16``: one process, 16 threads calling ``publish()`` (group commit on a
  packed topic; one PUT per message on a plain one);
- ``pk_publish_batch``: one process, ``publish_batch`` (full segments / one PUT each);
- ``pk_consume``: one process, ``listen(max_workers=8)`` with a trivial handler, from a
  backlog published beforehand (not measured);
- ``pk_e2e``: a producer process pacing itself at a steady rate (2,000 msg/s, open
  loop, 64 threads calling ``publish()``) and one consumer process (``listen``,
  8 workers); latency is publish() -> handler call. Packed only: a plain topic does
  not keep up with that rate on this machine (see ``pk_consume``'s plain row).
  ``pk_e2e_linger50`` is the same with the producer's ``publishing.linger_ms=50``.

Rows go to ``bench.packed`` (rendered by :mod:`benchmarks.packed_report`); the Spark
rows (:mod:`benchmarks.spark_bench`) and redis-message-queue rows
(:mod:`benchmarks.rmq`) join them there.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from benchmarks.driverlib import payload
from benchmarks.drivers import DriverFailed
from benchmarks.rows import summary_row
from benchmarks.settings import OURS

log = logging.getLogger("benchmarks")

PACKED, PLAIN = "packed", "plain"
PAYLOAD_BYTES = 1024
#: one listen() setting for both kinds of topic, so that only the topic differs
CONSUME = {"workers": 8, "max_messages": 64, "claim_threads": 16}


def packed_sizes(quick: bool) -> dict[str, Any]:
    """Messages per scenario and kind of topic. A plain topic gets fewer: its rates are
    ~1/20-1/100 of a packed one's, and the rows compare rates, not totals."""
    if quick:
        return {
            "publish16": {PACKED: 3000, PLAIN: 300},
            "publish_batch": {PACKED: 20000, PLAIN: 400},
            "consume": {PACKED: 5000, PLAIN: 300},
            "e2e_rate": 2000.0, "e2e_seconds": 3.0,
            "spark": {PACKED: 10000, PLAIN: 500},
            "rmq": 5000,
        }
    return {
        "publish16": {PACKED: 50000, PLAIN: 3000},
        "publish_batch": {PACKED: 100000, PLAIN: 5000},
        "consume": {PACKED: 50000, PLAIN: 1500},
        "e2e_rate": 2000.0, "e2e_seconds": 15.0,
        "spark": {PACKED: 100000, PLAIN: 5000},
        "rmq": 20000,
    }


def loadavg() -> list[float]:
    """The load average (1, 5, 15 min) now: recorded with every row."""
    return [round(x, 2) for x in os.getloadavg()]


class PackedRun:
    """Issue 14's packed-topic scenarios of one benchmark run (``bench``: a
    :class:`benchmarks.scenarios.Bench`)."""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.size = packed_sizes(bench.args.quick)
        if not hasattr(bench, "packed"):
            bench.packed = []
        self.rows: list[dict[str, Any]] = bench.packed

    def config(self, max_messages: int = CONSUME["max_messages"]) -> dict[str, Any]:
        return self.bench.config(OURS, "conditional_write", max_messages,
                                 claim_threads=CONSUME["claim_threads"])

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        row.setdefault("loadavg", loadavg())
        row["payload_bytes"] = PAYLOAD_BYTES
        self.rows.append(row)
        return row

    def failed(self, scenario: str, exc: BaseException) -> None:
        log.error("%s failed: %s", scenario, exc)
        self.rows.append({"scenario": scenario, "error": str(exc)[-2000:],
                          "loadavg": loadavg()})

    # -- setup --------------------------------------------------------------------------

    def make_topic(self, topic: str, kind: str) -> Any:
        """Create ``topic`` (packed or plain) through the runner's own client."""
        pq = self.bench._seeder(self.bench.bucket[OURS])
        if kind == PACKED:
            pq.create_topic(topic, packed=True)
        else:
            pq.create_topic(topic)
        return pq

    def seed(self, topic: str, kind: str, n: int) -> float:
        """Publish a backlog of ``n`` 1 KiB messages (not measured); returns seconds."""
        import time

        pq = self.make_topic(topic, kind)
        producer = pq.register_producer("bench-seeder")
        t0 = time.monotonic()
        for start in range(0, n, 10000):
            producer.publish_batch(topic, [payload(i, PAYLOAD_BYTES)
                                           for i in range(start, min(n, start + 10000))],
                                   threads=16)
        return time.monotonic() - t0

    # -- scenarios ----------------------------------------------------------------------

    def run(self) -> None:
        for name, step in (("pk_publish16", self.publish16),
                           ("pk_publish_batch", self.publish_batch),
                           ("pk_consume", self.consume), ("pk_e2e", self.e2e),
                           ("pk_e2e_linger50", lambda: self.e2e(linger_ms=50))):
            log.info("== %s", name)
            try:
                step()
            except (DriverFailed, TypeError, OSError, RuntimeError, ValueError) as exc:
                # TypeError: a checkout without create_topic(packed=True)
                self.failed(name, exc)

    def _publish(self, scenario: str, mode: str, how: dict[str, str],
                 counts: dict[str, int]) -> None:
        phases = []
        drivers = self.bench.drivers
        try:
            for kind in (PACKED, PLAIN):
                spec = {"role": "publish", "mode": mode, "n": counts[kind], "threads": 16,
                        "chunk": 20000, "payload_bytes": PAYLOAD_BYTES,
                        "packed": kind == PACKED,
                        "topic": self.bench.topic(f"{scenario}-{kind}"),
                        "config": self.config(), "name": "bench-producer"}
                phases.append((kind, drivers.start(OURS, [spec])))
            for kind, phase in phases:
                run = drivers.finish(phase, timeout=max(120.0, counts[kind] / 50.0))
                self.add(summary_row(scenario, kind, run, published=counts[kind],
                                     processes=1, strategy="conditional_write",
                                     consume=False, mode=how[kind]))
        finally:
            for _, phase in phases:
                drivers.abort(phase)

    def publish16(self) -> None:
        how = "publish() from 16 threads"
        self._publish("pk_publish16", "threads", {PACKED: how, PLAIN: how},
                      self.size["publish16"])

    def publish_batch(self) -> None:
        how = "publish_batch(threads=16), 20,000 payloads a call"
        self._publish("pk_publish_batch", "batch", {PACKED: how, PLAIN: how},
                      self.size["publish_batch"])

    def consume(self) -> None:
        drivers = self.bench.drivers
        counts = self.size["consume"]
        started = []
        try:
            for kind in (PACKED, PLAIN):
                topic = self.bench.topic(f"pk_consume-{kind}")
                took = self.seed(topic, kind, counts[kind])
                log.info("seeded %d messages to a %s topic in %.1f s", counts[kind], kind,
                         took)
                spec = {"role": "consume", "mode": "listen", "topic": topic,
                        "create_topic": False, "config": self.config(),
                        "workers": CONSUME["workers"], "name": "bench-consumer"}
                started.append((kind, drivers.start(OURS, [spec])))
            for kind, phase in started:
                n = counts[kind]
                run = drivers.finish(phase, timeout=max(120.0, n / 20.0), expect=n)
                self.add(summary_row(
                    "pk_consume", kind, run, published=n, processes=1,
                    strategy="conditional_write", consume=True,
                    mode=f"listen(max_workers={CONSUME['workers']}), trivial handler, "
                         f"max_messages_per_poll={CONSUME['max_messages']}, "
                         f"claim_threads={CONSUME['claim_threads']}"))
        finally:
            for _, phase in started:
                drivers.abort(phase)

    def e2e(self, linger_ms: int | None = None) -> None:
        """End to end at a steady rate; with ``linger_ms``, the producer's
        ``publishing.linger_ms`` (default 5): fuller segments for a longer wait."""
        rate, seconds = self.size["e2e_rate"], self.size["e2e_seconds"]
        n = int(rate * seconds)
        suffix = f"_linger{linger_ms}" if linger_ms is not None else ""
        topic = self.bench.topic(f"pk_e2e{suffix}-packed")
        self.make_topic(topic, PACKED)
        cfg = self.config()
        prod_cfg = self.config()
        if linger_ms is not None:
            prod_cfg["publishing"]["linger_ms"] = linger_ms
        cons = {"role": "consume", "mode": "listen", "stamp": "handler", "topic": topic,
                "create_topic": False, "config": cfg, "workers": CONSUME["workers"],
                "name": "bench-e2e"}
        prod = {"role": "publish", "mode": "threads", "threads": 64, "rate": rate, "n": n,
                "payload_bytes": PAYLOAD_BYTES, "topic": topic, "create_topic": False,
                "config": prod_cfg, "name": "bench-e2e-producer", "counted": False}
        run = self.bench.drivers.drive(OURS, [cons, prod], timeout=seconds + 120, expect=n)
        row = summary_row(f"pk_e2e_{rate:g}msg_s{suffix}", PACKED, run, published=n,
                          processes=1, strategy="conditional_write", consume=True,
                          mode=f"1 producer process at {rate:,.0f} msg/s (64 threads "
                               f"calling publish(), linger_ms="
                               f"{linger_ms if linger_ms is not None else '5 (default)'}) "
                               f"+ 1 consumer process (listen, {CONSUME['workers']} workers)",
                          note="latency: publish() call -> handler call; requests and "
                               "CPU are the consumer's (the producer's are in producer_*)")
        prod_res = run["results"][1]
        took = max(prod_res["t_end"] - prod_res["t_go"], 1e-9)
        requests = prod_res["requests"]
        total = sum(v for k, v in requests.items() if not k.startswith("!"))
        row.update({
            "producer_msgs_per_s": n / took,
            "producer_late_ms": prod_res.get("late_ms"),
            "producer_requests": requests,
            "producer_requests_per_msg": total / n,
            "producer_cpu_ms_per_msg": 1000.0 * prod_res["cpu"] / n,
        })
        log.info("e2e packed: producer %.0f msg/s (late p99 %s ms), %.3f req/msg; "
                 "latency p50 %s p99 %s ms", row["producer_msgs_per_s"],
                 (prod_res.get("late_ms") or {}).get("p99"), row["producer_requests_per_msg"],
                 row["latency_ms"]["p50"], row["latency_ms"]["p99"])
        self.add(row)


def packed_steps(bench: Any) -> list[tuple[str, Any]]:
    """Issue 14's steps of a run, after the plain ones: ``packed``, ``redis`` and
    ``spark``. Spark runs with ``--spark``, ``--only spark`` or in a full run (neither
    ``--quick`` nor ``--only``)."""
    run = PackedRun(bench)

    def redis() -> None:
        from benchmarks.rmq import run_rmq

        run.rows.extend(run_rmq(run.size["rmq"], PAYLOAD_BYTES, bench.workdir))

    def spark() -> None:
        from benchmarks.spark_bench import run_spark

        run_spark(run)

    only = set(bench.args.only.split(",")) if bench.args.only else set()
    steps: list[tuple[str, Any]] = [("packed", run.run), ("redis", redis)]
    if getattr(bench.args, "spark", False) or "spark" in only or not (only or
                                                                       bench.args.quick):
        steps.append(("spark", spark))
    return steps
