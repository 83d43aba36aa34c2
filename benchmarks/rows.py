"""Turning what driver processes report into result rows: messages, duplicates and
losses counted by id, throughput from the common go, requests and CPU per message."""

from __future__ import annotations

import logging
import os
from typing import Any

from benchmarks.driverlib import quantile

log = logging.getLogger("benchmarks")


def summary_row(scenario: str, lib: str, run: dict[str, Any], *, published: int,
                processes: int, strategy: str, consume: bool, mode: str,
                note: str = "") -> dict[str, Any]:
    """One scenario row from a phase's results and ack rows (see
    :meth:`benchmarks.drivers.Drivers.finish`); ``consume`` rows count the acked ids."""
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
    return row


def total_requests(ops: dict[str, int]) -> int:
    """Requests sent; keys starting with ``!`` count error answers among them."""
    return sum(v for k, v in ops.items() if not k.startswith("!"))


def sum_ops(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))



def target(name: str, value: float | None, limit: float, op: str,
           detail: str = "") -> dict[str, Any]:
    """A target row: ``value`` against ``op`` (">=" or "<=") ``limit``; met is None
    when nothing was measured."""
    met = None if value is None else (value >= limit if op == ">=" else value <= limit)
    return {"target": name, "value": value, "limit": f"{op} {limit:g}", "met": met,
            "detail": detail}


def fmt(v: Any, digits: int = 1) -> str:
    """A number for a table: thousands separated, ``-`` for None."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)
