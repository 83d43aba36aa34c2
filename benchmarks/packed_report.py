"""Issue 14's part of the results: packed topics beside plain ones, the
redis-message-queue anchor and Spark, the issue's targets, and a cost table in
dollars per million messages at AWS S3 Standard request prices, beside SQS."""

from __future__ import annotations

from typing import Any

from benchmarks.rows import fmt as _f
from benchmarks.rows import target

PACKED, PLAIN = "packed", "plain"
#: AWS S3 Standard request prices (us-east-1), dollars per request
PRICE = {"PUT": 0.005 / 1000, "GET": 0.0004 / 1000, "free": 0.0}
#: S3 operation -> AWS price class. DeleteObjects is a POST (priced as PUT here, an upper
#: bound); an operation not listed is priced as PUT too.
OP_CLASS = {
    "PutObject": "PUT", "CopyObject": "PUT", "ListObjectsV2": "PUT", "ListObjects": "PUT",
    "DeleteObjects": "PUT", "CreateBucket": "PUT",
    "GetObject": "GET", "HeadObject": "GET", "HeadBucket": "GET",
    "DeleteObject": "free",
}
SQS_PER_REQUEST = 0.40 / 1e6
TARGET_ORDER = ["pk_publish16", "pk_publish_batch", "pk_consume", "pk_e2e_2000msg_s",
                "pk_e2e_2000msg_s_linger50",
                "rmq_publish_1", "rmq_consume_1", "spark_rows_to_json",
                "spark_publish_dataframe", "spark_process_topic"]


def build(rows: list[dict[str, Any]], previous: dict[str, Any] | None) -> dict[str, Any]:
    """The ``packed`` part of a results document (``previous``: ``--merge``'s)."""
    rows = [dict(r) for r in rows]
    if previous and previous.get("packed"):
        new = {(r.get("scenario"), r.get("lib")) for r in rows}
        rows = [r for r in previous["packed"].get("rows", [])
                if (r.get("scenario"), r.get("lib")) not in new] + rows
    order = {name: i for i, name in enumerate(TARGET_ORDER)}
    rows.sort(key=lambda r: (order.get(r.get("scenario"), len(order)),
                            r.get("lib") != PACKED))
    for r in rows:
        plain = _row(rows, r.get("scenario"), PLAIN)
        if r.get("lib") == PACKED and plain and plain.get("msgs_per_s"):
            r["ratio_vs_plain"] = r["msgs_per_s"] / plain["msgs_per_s"]
    return {"rows": rows, "targets": targets(rows), "cost": cost(rows)} if rows else {}


def _row(rows: list[dict[str, Any]], scenario: Any, lib: str) -> dict[str, Any] | None:
    for r in rows:
        if r.get("scenario") == scenario and str(r.get("lib", "")).startswith(lib) \
                and "error" not in r and "absent" not in r:
            return r
    return None


def per_msg(row: dict[str, Any], key: str = "requests") -> dict[str, float]:
    """Requests per message by operation (error answers, ``!Op status``, are among them
    and not counted twice)."""
    n = row.get("messages") or 0
    ops = row.get(key) or {}
    return {op: k / n for op, k in sorted(ops.items()) if n and not op.startswith("!")}


def dollars_per_million(ops: dict[str, float]) -> float:
    """Dollars per million messages for these requests per message."""
    return sum(v * PRICE[OP_CLASS.get(op, "PUT")] for op, v in ops.items()) * 1e6


def cost(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dollars per million messages, publish + consume, from measured requests."""
    out = []
    consume = {k: _row(rows, "pk_consume", k) for k in (PACKED, PLAIN)}
    for kind in (PLAIN, PACKED):
        for scen, how in (("pk_publish16", "publish() from 16 threads"),
                         ("pk_publish_batch", "publish_batch")):
            pub, con = _row(rows, scen, kind), consume[kind]
            if pub and con:
                out.append(_cost_row(f"{kind} topic, {how}; listen(max_workers=8)",
                                    per_msg(pub), per_msg(con)))
    for scen, how in (("pk_e2e_2000msg_s", ""),
                      ("pk_e2e_2000msg_s_linger50", ", linger_ms=50")):
        e2e = _row(rows, scen, PACKED)
        if e2e and e2e.get("messages"):
            pub = {op: k / e2e["published"]
                   for op, k in e2e.get("producer_requests", {}).items()
                   if not op.startswith("!")}
            out.append(_cost_row(f"packed topic at a steady 2,000 msg/s{how} (end-to-end "
                                 "run: its producer and consumer)", pub, per_msg(e2e)))
    for name, requests in (("SQS, unbatched (send, receive, delete: 3 requests)", 3.0),
                          ("SQS, batched by 10 (0.3 requests)", 0.3)):
        out.append({"how": name, "publish_ops": {}, "consume_ops": {},
                    "publish": None, "consume": None,
                    "total": requests * SQS_PER_REQUEST * 1e6})
    return out


def _cost_row(how: str, pub: dict[str, float], con: dict[str, float]) -> dict[str, Any]:
    p, c = dollars_per_million(pub), dollars_per_million(con)
    return {"how": how, "publish_ops": pub, "consume_ops": con, "publish": p, "consume": c,
            "total": p + c}


def _load(r: dict[str, Any] | None) -> str:
    load = (r or {}).get("loadavg")
    return f"load {', '.join(f'{x:.2f}' for x in load)}" if load else ""


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []

    def rate(scen: str, kind: str = PACKED) -> float | None:
        r = _row(rows, scen, kind)
        return r.get("msgs_per_s") if r else None

    def detail(scen: str) -> str:
        p, q = _row(rows, scen, PACKED), _row(rows, scen, PLAIN)
        bits = []
        if p:
            bits.append(f"{p['msgs_per_s']:,.0f} msg/s, "
                       f"{_f(p.get('client_cpu_ms_per_msg'), 3)} ms client CPU/msg")
        if q:
            bits.append(f"plain {q['msgs_per_s']:,.0f} msg/s")
        return "; ".join([*bits, _load(p)])

    out.append(target("publish, 1 process, 16 threads calling publish() (msg/s)",
                      rate("pk_publish16"), 10000, ">=", detail("pk_publish16")))
    out.append(target("publish_batch, 1 process (msg/s)", rate("pk_publish_batch"), 50000,
                      ">=", detail("pk_publish_batch")))
    out.append(target("consume, 1 process, listen(max_workers=8), trivial handler (msg/s)",
                      rate("pk_consume"), 5000, ">=", detail("pk_consume")))
    p = _row(rows, "pk_consume", PACKED)
    out.append(target("consume: packed / plain in the same run",
                      (p or {}).get("ratio_vs_plain"), 10, ">=", detail("pk_consume")))
    for scen, what, limit in (("pk_publish16", "publish() x16 threads", 0.02),
                             ("pk_publish_batch", "publish_batch", 0.02),
                             ("pk_consume", "consume", 0.05)):
        r = _row(rows, scen, PACKED)
        out.append(target(f"S3 requests per message, {what}",
                          r.get("requests_per_msg") if r else None, limit, "<=",
                          _ops(per_msg(r)) if r else ""))
    e = _row(rows, "pk_e2e_2000msg_s", PACKED)
    lat = (e or {}).get("latency_ms") or {}
    prod = ""
    if e:
        late = e.get("producer_late_ms") or {}
        prod = (f"producer {_f(e['producer_msgs_per_s'], 0)} msg/s (starts late p99 "
                f"{_f(late.get('p99'), 0)} ms), {_f(e['producer_requests_per_msg'], 3)} "
                f"req/msg; consumer {_f(e['requests_per_msg'], 3)} req/msg; {_load(e)}")
    out.append(target("end to end at 2,000 msg/s: p50 ms publish -> handler",
                      lat.get("p50"), 200, "<=", prod))
    out.append(target("end to end at 2,000 msg/s: p99 ms publish -> handler",
                      lat.get("p99"), 1000, "<=", prod))
    rmq = _row(rows, "rmq_consume_1", "redis-message-queue")
    absent = next((r for r in rows if r.get("scenario") == "rmq_consume_1"
                   and "absent" in r), None)
    out.append(target(
        "consume: packed listen(8) / redis-message-queue single consumer",
        (p["msgs_per_s"] / rmq["msgs_per_s"]) if p and rmq else None, 2, ">=",
        f"redis-message-queue {rmq['msgs_per_s']:,.0f} msg/s, {_load(rmq)}" if rmq
        else (f"absent: {absent['absent']}" if absent else "")))
    for scen, what in (("spark_publish_dataframe", "publish_dataframe"),
                      ("spark_process_topic", "process_topic")):
        r, q = _row(rows, scen, PACKED), _row(rows, scen, PLAIN)
        out.append(target(
            f"Spark local[2] {what}: packed / plain msg/s", r.get("ratio_vs_plain")
            if r else None, 20, ">=",
            f"packed {r['messages']:,} in {r['seconds']:.1f} s, plain {q['messages']:,} in "
            f"{q['seconds']:.1f} s (fewer rows: rates compared); {_load(r)}"
            if r and q else ""))
    return out


def _ops(ops: dict[str, float], digits: int = 3) -> str:
    return ", ".join(f"{op} {v:.{digits}f}" for op, v in ops.items())


def markdown(packed: dict[str, Any]) -> str:
    if not packed:
        return ""
    lines = ["", "### Packed topics (issue 14)", "",
             "1 KiB payloads; packed and plain topics of the same step measured in the same "
             "run on the same server with the same settings. Requests per message by "
             "operation; for redis-message-queue, client round trips (and the commands "
             "Redis ran, Lua scripts' included). Load average (1, 5, 15 min) taken when "
             "each row ended.", "",
             "| scenario | topic | how | msgs | msg/s | packed / plain | p50 / p99 ms | "
             "req/msg | requests per message, by operation | client CPU ms/msg | "
             "server CPU ms/msg | dup | lost | load |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in packed["rows"]:
        if "error" in r or "absent" in r:
            why = f"FAILED: {r['error'][:160]!r}" if "error" in r else f"absent: {r['absent']}"
            lines.append(f"| {r['scenario']} | {r.get('lib', '-')} | {why} | | | | | | | | | "
                        f"| | {_load(r)} |")
            continue
        lat = r.get("latency_ms") or {}
        lat_s = (f"{_f(lat.get('p50'), 0)} / {_f(lat.get('p99'), 0)}"
                 if r["scenario"].startswith("pk_e2e") else "-")
        ratio = r.get("ratio_vs_plain")
        if "redis_commands_per_msg" in r:
            ops = (f"round trips {r['requests_per_msg']:.2f} ({r['redis_commands_per_msg']:.1f}"
                   " commands)")
        else:
            ops = _ops(per_msg(r), 4) if r.get("requests") else "not counted"
        lines.append(
            f"| {r['scenario']} | {r['lib']} | {r['mode']} | {r['messages']:,} | "
            f"{_f(r['msgs_per_s'])} | {'**' + _f(ratio, 1) + 'x**' if ratio else ''} | "
            f"{lat_s} | {_f(r.get('requests_per_msg'), 3)} | {ops} | "
            f"{_f(r.get('client_cpu_ms_per_msg'), 3)} | "
            f"{_f(r.get('server_cpu_ms_per_msg'), 3)} | {_f(r.get('duplicates'))} | "
            f"{_f(r.get('lost'))} | {_load(r).removeprefix('load ')} |")
    for e in (r for r in packed["rows"] if str(r.get("scenario")).startswith("pk_e2e")
              and "producer_requests" in r):
        late = e.get("producer_late_ms") or {}
        prod_ops = _ops(per_msg({"messages": e["published"],
                                 "requests": e["producer_requests"]}))
        lines += ["", f"End to end ({e['scenario']}): the producer published "
                  f"{e['published']:,} messages at "
                  f"{_f(e['producer_msgs_per_s'], 0)} msg/s (publish() calls started late by "
                  f"p50 {_f(late.get('p50'), 1)} / p99 {_f(late.get('p99'), 1)} / max "
                  f"{_f(late.get('max'), 1)} ms), {_f(e['producer_requests_per_msg'], 3)} "
                  f"requests per message ({prod_ops}), "
                  f"{_f(e['producer_cpu_ms_per_msg'], 3)} ms client CPU per message."]
    lines += ["", "Cost of the requests per message above at AWS S3 Standard request prices "
              "(PUT, COPY, POST, LIST $0.005 per 1,000; GET, HEAD $0.0004 per 1,000; DELETE "
              "free; DeleteObjects, a POST, priced as PUT), dollars per million messages "
              "published and consumed; storage and transfer not included:", "",
              "| topic, how | publish: requests per message | consume: requests per message "
              "| $ publish | $ consume | $ per million messages |",
              "|---|---|---|---:|---:|---:|"]
    for c in packed["cost"]:
        lines.append(f"| {c['how']} | {_ops(c['publish_ops'], 4) or '-'} | "
                     f"{_ops(c['consume_ops'], 4) or '-'} | {_f(c['publish'], 3)} | "
                     f"{_f(c['consume'], 3)} | **{c['total']:,.3f}** |")
    lines += ["", "Targets (issue 14):", "", "| target | measured | wanted | met | detail |",
              "|---|---:|---:|:---:|---|"]
    for t in packed["targets"]:
        met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
        lines.append(f"| {t['target']} | {_f(t['value'], 3 if (t['value'] or 9) < 1 else 1)} "
                     f"| {t['limit']} | {met} | {t['detail']} |")
    return "\n".join(lines) + "\n"
