"""Issue 16's step ``ops``: what a delayed or a deduplicated message costs, in requests
per message, next to plain publishing, on the run's server.

pawn-queue 0.1.x has neither feature, so these rows are ours alone; they run in the
runner's process (requests are counted with the same botocore hook as the drivers') and
measure counts, not speed (a rate is shown, but one client thread is not a benchmark of
throughput). Rows, each on a topic of its own:

- ``publish``: ``publish()`` in a loop (plain topic), the baseline;
- ``publish_delay``: ``publish(delay_seconds=D)``;
- ``publish_dedup``: ``publish(dedup_id=K)`` with a new K each time;
- ``publish_dedup_repeat``: the same calls again (every K already seen: writes nothing);
- ``publish_delay_dedup``: both options at once;
- ``consume`` and ``consume_delayed``: one consumer polling and acking every message of
  the ``publish`` and ``publish_delay`` topics (the delayed ones once due: their
  promotion to ``messages/`` is in the count);
- ``packed_publish16`` and ``packed_dedup16``: 16 threads calling ``publish()`` on a
  packed topic, without and with a dedup id.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.driverlib import RequestCounter
from benchmarks.settings import OURS

log = logging.getLogger("benchmarks")

#: the order of the rows in the table
ORDER = ["publish", "publish_delay", "publish_dedup", "publish_dedup_repeat",
         "publish_delay_dedup", "consume", "consume_delayed", "packed_publish16",
         "packed_dedup16"]
DELAY = 2.0  # seconds: short, so the run waits little for the delayed messages


def ops_sizes(quick: bool) -> dict[str, int]:
    return {"plain": 60, "packed": 600} if quick else {"plain": 500, "packed": 5000}


def run_ops(bench: Any) -> list[dict[str, Any]]:
    """Measure every row; the rows (also appended to ``bench.ops``)."""
    from pawn_queue_sync import PawnQueue

    size = ops_sizes(bench.args.quick)
    cfg = bench.config(OURS, "conditional_write", 32)
    counter = RequestCounter()
    rows: list[dict[str, Any]] = []
    with PawnQueue(cfg) as pq:
        counter.register(pq.store._client().meta.events)  # type: ignore[attr-defined]
        run = _OpsRun(bench, pq, counter, rows)
        run.plain(size["plain"])
        run.packed(size["packed"])
    bench.ops = getattr(bench, "ops", []) + rows
    return rows


class _OpsRun:
    def __init__(self, bench: Any, pq: Any, counter: RequestCounter,
                 rows: list[dict[str, Any]]) -> None:
        self.bench, self.pq, self.counter, self.rows = bench, pq, counter, rows
        self.producer = pq.register_producer("bench-ops")

    def topic(self, name: str, packed: bool = False) -> str:
        topic = self.bench.topic(f"ops-{name}")
        self.pq.create_topic(topic, packed=packed)
        return topic

    def measure(self, scenario: str, kind: str, n: int, work: Callable[[], int]) -> None:
        """Run ``work`` (returns the messages it handled, checked against ``n``) and
        record its requests."""
        before = self.counter.snapshot()
        start = time.perf_counter()
        done = work()
        took = time.perf_counter() - start
        ops = RequestCounter.diff(self.counter.snapshot(), before)
        total = sum(v for op, v in ops.items() if not op.startswith("!"))
        row = {"scenario": scenario, "lib": kind, "messages": n, "handled": done,
               "requests": ops, "requests_per_msg": total / n if n else None,
               "msgs_per_s": n / took if took > 0 else None, "seconds": round(took, 3)}
        if done != n:
            row["error"] = f"handled {done} of {n}"
        log.info("%-22s %-6s %5d msgs %6.2f req/msg %s", scenario, kind, n,
                 row["requests_per_msg"] or 0, ops)
        self.rows.append(row)

    def publish_loop(self, topic: str, n: int, **options: Callable[[int], Any]) -> int:
        for i in range(n):
            self.producer.publish(topic, {"i": i}, **{k: f(i) for k, f in options.items()})
        return n

    def drain(self, topic: str, n: int) -> int:
        """Poll and ack until ``n`` distinct messages were acked (or 60 s pass)."""
        consumer = self.pq.register_consumer("bench-ops-consumer", [topic])
        seen: set[str] = set()
        deadline = time.monotonic() + 60.0
        try:
            while len(seen) < n and time.monotonic() < deadline:
                msgs = consumer.poll()
                consumer.ack_many(msgs)
                seen.update(m.id for m in msgs)
                if not msgs:
                    time.sleep(0.2)
        finally:
            consumer.close()
        return len(seen)

    def plain(self, n: int) -> None:
        base, delayed = self.topic("publish"), self.topic("delay")
        dedup, both = self.topic("dedup"), self.topic("delay-dedup")
        keys = [str(uuid.uuid4()) for _ in range(n)]
        self.measure("publish", "plain", n, lambda: self.publish_loop(base, n))
        self.measure("publish_delay", "plain", n, lambda: self.publish_loop(
            delayed, n, delay_seconds=lambda i: DELAY))
        due = time.monotonic() + DELAY + 1.0
        self.measure("publish_dedup", "plain", n, lambda: self.publish_loop(
            dedup, n, dedup_id=lambda i: keys[i]))
        self.measure("publish_dedup_repeat", "plain", n, lambda: self.publish_loop(
            dedup, n, dedup_id=lambda i: keys[i]))
        self.measure("publish_delay_dedup", "plain", n, lambda: self.publish_loop(
            both, n, delay_seconds=lambda i: DELAY, dedup_id=lambda i: keys[i]))
        self.measure("consume", "plain", n, lambda: self.drain(base, n))
        time.sleep(max(0.0, due - time.monotonic()))  # every delayed message is due
        self.measure("consume_delayed", "plain", n, lambda: self.drain(delayed, n))

    def packed(self, n: int) -> None:
        for scenario, dedup in (("packed_publish16", False), ("packed_dedup16", True)):
            topic = self.topic(scenario, packed=True)
            self.measure(scenario, "packed", n,
                         lambda topic=topic, dedup=dedup: self.threads(topic, n, dedup))

    def threads(self, topic: str, n: int, dedup: bool, threads: int = 16) -> int:
        done = [0] * threads

        def work(t: int) -> None:
            for i in range(t, n, threads):
                extra = {"dedup_id": f"k{i}"} if dedup else {}
                self.producer.publish(topic, {"i": i}, **extra)
                done[t] += 1

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        return sum(done)


def ops_report(rows: list[dict[str, Any]], previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The ``ops`` rows of a results document, ``previous``'s kept under ``--merge``
    when this run did not measure them."""
    rows = [dict(r) for r in rows]
    if previous and previous.get("ops"):
        new = {r["scenario"] for r in rows}
        rows = [r for r in previous["ops"] if r.get("scenario") not in new] + rows
    order = {name: i for i, name in enumerate(ORDER)}
    rows.sort(key=lambda r: order.get(r.get("scenario"), len(order)))
    base = {r["lib"]: r.get("requests_per_msg") for r in rows
            if r.get("scenario") in ("publish", "packed_publish16")}
    for r in rows:
        ref = base.get(r.get("lib"))
        if ref and r.get("requests_per_msg") is not None and r["scenario"].startswith(
                ("publish", "packed")):
            r["extra_requests_per_msg"] = r["requests_per_msg"] - ref
    return rows


def ops_markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    lines = [
        "",
        "### Delayed and deduplicated messages (issue 16)",
        "",
        "Requests per message, ours only (pawn-queue 0.1.x has neither feature); one "
        "client thread unless the row says 16, so the rates are not throughput figures. "
        "`extra` is the difference to plain publishing on the same kind of topic.",
        "",
        "| row | topic | messages | requests/msg | extra | by operation (per msg) | msg/s |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        n = r.get("messages") or 0
        per = ", ".join(f"{op} {v / n:.2f}" for op, v in (r.get("requests") or {}).items()
                        if n) or "-"
        extra = r.get("extra_requests_per_msg")
        lines.append(
            f"| {r['scenario']} | {r['lib']} | {n} | "
            f"{r.get('requests_per_msg') or 0:.2f} | "
            f"{'' if extra is None else f'{extra:+.2f}'} | {per} | "
            f"{r.get('msgs_per_s') or 0:,.0f} |"
            + (f" **{r['error']}**" if r.get("error") else ""))
    return "\n".join(lines) + "\n"
