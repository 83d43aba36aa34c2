"""Turn a benchmark run into JSON, markdown tables, and docs/performance.md."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks import packed_report
from benchmarks.ops_costs import ops_markdown, ops_report
from benchmarks.rows import fmt as _f
from benchmarks.rows import target as _target

OURS, PQ = "ours", "pawn-queue"
#: ours' scenario -> pawn-queue's scenario it is compared with
BASELINE = {"consume_1proc_listen": "consume_1proc"}
SCENARIO_ORDER = ["publish_seq", "publish_batch", "consume_1proc", "consume_1proc_listen",
                  "consume_3proc", "csprng_1proc", "csprng_3proc", "e2e_10msg_s"]
#: in docs/performance.md, text below this line is hand-written and kept on rewrite
KEEP_MARKER = "<!-- generated above; hand-written below is kept by --doc -->"


def build(bench: Any, info: dict[str, Any], *, quick: bool,
          previous: dict[str, Any] | None = None) -> dict[str, Any]:
    scenarios = [dict(r) for r in bench.scenarios]
    scaling = list(bench.scaling)
    idle = list(bench.idle)
    if previous:  # --merge: keep what this run did not measure again
        new = {(r.get("scenario"), r.get("lib")) for r in scenarios}
        scenarios = [dict(r, merged_from=previous.get("generated_at"))
                     for r in previous.get("scenarios", [])
                     if (r.get("scenario"), r.get("lib")) not in new] + scenarios
        order = {name: i for i, name in enumerate(SCENARIO_ORDER)}
        scenarios.sort(key=lambda r: order.get(r.get("scenario"), len(order)))
        new_scale = {(r["lib"], r["backlog"]) for r in scaling}
        scaling = sorted([r for r in previous.get("scaling", [])
                          if (r["lib"], r["backlog"]) not in new_scale] + scaling,
                         key=lambda r: (r["backlog"], r["lib"] != OURS))
        new_idle = {r["lib"] for r in idle}
        idle = [r for r in previous.get("idle", []) if r["lib"] not in new_idle] + idle
        info = merged_machine(previous, info, bench)
    by_key = {(r.get("scenario"), r.get("lib")): r for r in scenarios if "lib" in r}
    for r in scenarios:
        if r.get("lib") != OURS:
            continue
        base = by_key.get((BASELINE.get(r["scenario"], r["scenario"]), PQ))
        if base and base.get("msgs_per_s") and not r["scenario"].startswith("e2e"):
            # (end to end runs at a fixed publish rate: compare latencies there)
            r["ratio_vs_pawn_queue"] = r["msgs_per_s"] / base["msgs_per_s"]
        if base and base.get("client_cpu_ms_per_msg") and r.get("client_cpu_ms_per_msg"):
            # how many times less client CPU ours spends per message: the throughput
            # ratio to expect where both are bound by the client's CPU
            r["cpu_ratio_vs_pawn_queue"] = (base["client_cpu_ms_per_msg"]
                                            / r["client_cpu_ms_per_msg"])
    doc = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": quick,
        "endpoint": bench.endpoint,
        "machine": info,
        "settings": {
            "polling": "interval_seconds=0.2 (1.0 when idle), visibility_timeout_seconds=30; "
                       "max_messages_per_poll as given per row (same for both libraries)",
            "csprng_verify": "jitter 100-400 ms, verify_retries=2, verify_retry_delay_ms=150 "
                             "(both libraries' defaults)",
            "payload": '{"seq": i, "t": publish time}; ~170-byte message objects',
            "seeding": "consume scenarios start from a backlog published beforehand (not "
                       "measured) with our publish_batch; both libraries use the same layout",
        },
        "scenarios": scenarios,
        "scaling": scaling,
        "idle": idle,
    }
    doc["targets"] = targets(doc)
    doc["packed"] = packed_report.build(list(getattr(bench, "packed", [])), previous)
    doc["ops"] = ops_report(list(getattr(bench, "ops", [])), previous)
    return doc


def merged_machine(previous: dict[str, Any], info: dict[str, Any],
                   bench: Any) -> dict[str, Any]:
    """The earlier run's machine record, plus a note of this run merged into it."""
    base = dict(previous.get("machine") or info)
    merges = [m for m in base.get("merged", []) if m.get("generated_at")]
    merges.append({
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "steps": getattr(bench.args, "only", None) or "all",
        "backlogs": bench.size.get("backlogs"),
        "loadavg_start": info.get("loadavg_start"),
        "loadavg_end": info.get("loadavg_end"),
        "core_fingerprint": info.get("core_fingerprint_end"),
        "git_head": info.get("git_head"),
        "duration_s": info.get("duration_s"),
    })
    base["merged"] = merges
    return base


def _row(doc: dict[str, Any], scenario: str, lib: str) -> dict[str, Any] | None:
    for r in doc["scenarios"]:
        if r.get("scenario") == scenario and r.get("lib") == lib:
            return r
    return None


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []

    def ratio(scen: str) -> tuple[float | None, str]:
        r = _row(doc, scen, OURS)
        return (r.get("ratio_vs_pawn_queue") if r else None), (r or {}).get("mode", "")

    best = [ratio("consume_1proc"), ratio("consume_1proc_listen")]
    best = [b for b in best if b[0] is not None]
    if best:
        v, mode = max(best, key=lambda b: b[0])
        out.append(_target("1 consumer process, conditional_write: ours / pawn-queue", v, 3,
                           ">=", mode))
    for scen, name, limit in (
        ("consume_3proc", "3 consumer processes, conditional_write: ours / pawn-queue", 6),
        ("csprng_1proc", "1 consumer process, csprng_verify: ours / pawn-queue", 50),
        ("csprng_3proc", "3 consumer processes, csprng_verify: ours / pawn-queue", 50),
    ):
        v, mode = ratio(scen)
        out.append(_target(name, v, limit, ">=", mode))
    for scen in ("consume_1proc_listen", "consume_1proc", "consume_3proc"):
        r = _row(doc, scen, OURS)
        if r:
            out.append(_target(f"S3 requests per consumed message ({scen})",
                               r.get("requests_per_msg"), 2.3, "<=", _ops_per_msg(r)))
    for scen in ("publish_seq", "publish_batch"):
        r = _row(doc, scen, OURS)
        if r:
            out.append(_target(f"S3 requests per published message ({scen})",
                               r.get("requests_per_msg"), 1.05, "<=", _ops_per_msg(r)))
    ours, pq = _row(doc, "publish_batch", OURS), _row(doc, "publish_batch", PQ)
    if ours and pq and pq.get("msgs_per_s"):
        out.append(_target(
            f"publish {ours['published']:,} from one process: ours / pawn-queue concurrent",
            ours["msgs_per_s"] / pq["msgs_per_s"], 2, ">=",
            f"{ours['msgs_per_s']:.0f} vs {pq['msgs_per_s']:.0f} msg/s"))
    scale = [s for s in doc["scaling"] if s["lib"] == OURS]
    if len(scale) >= 2:
        lo, hi = scale[0], scale[-1]
        out.append(_target(
            f"poll cost, backlog {lo['backlog']:,} -> {hi['backlog']:,}: growth of requests "
            "per poll (ours)", hi["requests_per_poll"] / lo["requests_per_poll"], 1.0, "<=",
            f"{lo['requests_per_poll']:.1f} -> {hi['requests_per_poll']:.1f} requests, "
            f"{lo['seconds_per_poll'] * 1000:.0f} -> {hi['seconds_per_poll'] * 1000:.0f} ms"))
    for idle in doc["idle"]:
        if idle["lib"] == OURS:
            out.append(_target("idle consumer: requests per interval_seconds (ours)",
                               idle["requests_per_interval"], 1, "<=",
                               f"{_fmt_ops(idle['requests'])} in {idle['seconds']:g} s, "
                               "from listen()'s start (the first poll, then one per "
                               "interval_seconds plus jitter); second half of the window: "
                               f"{_f(idle.get('requests_per_interval_second_half'), 2)}"))
    return out


def _ops_per_msg(r: dict[str, Any]) -> str:
    n = r.get("messages") or 0
    if not n:
        return ""
    return ", ".join(f"{op} {k / n:.2f}" for op, k in sorted(r["requests"].items()))


def _fmt_ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{op} {k}" for op, k in sorted(ops.items()))


def markdown(doc: dict[str, Any]) -> str:
    lines = []
    lines.append("| scenario | library | how | msgs | msg/s | ours / pawn-queue msg/s | "
                 "p50 / p99 ms publish->ack | S3 req/msg | client CPU ms/msg | "
                 "pawn-queue / ours CPU per msg | server CPU ms/msg | dup | lost |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in doc["scenarios"]:
        if "error" in r:
            lines.append(f"| {r['scenario']} | - | FAILED: {r['error'][:80]!r} |"
                         " | | | | | | | | | |")
            continue
        lat = r.get("latency_ms")
        # consume rows start from a backlog: their latency is mostly time spent queued
        lat_s = (f"{_f(lat['p50'], 0)} / {_f(lat['p99'], 0)}"
                 if lat and lat.get("p50") is not None and r["scenario"].startswith("e2e")
                 else "-")
        procs = f" x{r['processes']} proc" if r["processes"] > 1 else ""
        ratio = r.get("ratio_vs_pawn_queue")
        lines.append(
            f"| {r['scenario']} ({r['strategy'].replace('_', ' ')}) | {r['lib']}{procs} | "
            f"{r['mode']} | {r['messages']:,} | {_f(r['msgs_per_s'])} | "
            f"{'**' + _f(ratio, 2) + 'x**' if ratio is not None else ''} | {lat_s} | "
            f"{_f(r['requests_per_msg'], 2)} | {_f(r['client_cpu_ms_per_msg'], 2)} | "
            f"{_f(r.get('cpu_ratio_vs_pawn_queue'), 2)} | "
            f"{_f(r['server_cpu_ms_per_msg'], 2)} | {_f(r['duplicates'])} | "
            f"{_f(r['lost'])} |")
    lines.append("")
    lines.append("S3 requests per message, by operation (`!Op status`: error answers "
                 "among them, e.g. lost conditional claims, reads of vanished objects):")
    lines.append("")
    lines.append("| scenario | library | requests per message |")
    lines.append("|---|---|---|")
    for r in doc["scenarios"]:
        if "error" not in r:
            lines.append(f"| {r['scenario']} | {r['lib']} | {_ops_per_msg(r)} |")
    if doc["scaling"]:
        lines.append("")
        lines.append("Poll cost against backlog (one poll of up to 10 messages, then acks):")
        lines.append("")
        lines.append("| pending messages | library | S3 requests per poll | seconds per poll | "
                     "client CPU s per poll | requests per message | requests per poll, "
                     "by operation |")
        lines.append("|---:|---|---:|---:|---:|---:|---|")
        for s in doc["scaling"]:
            ops = {k: v / s["polls"] for k, v in s["poll_requests_by_op"].items()}
            lines.append(
                f"| {s['backlog']:,} | {s['lib']} | {s['requests_per_poll']:.1f} | "
                f"{s['seconds_per_poll']:.3f} | {s['cpu_s_per_poll']:.3f} | "
                f"{_f(s['requests_per_msg'], 2)} | "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(ops.items())) + " |")
    if doc["idle"]:
        lines.append("")
        lines.append("Idle consumer (empty topic, interval_seconds=1.0):")
        lines.append("")
        lines.append("| library | how | seconds | requests per interval | same, second half "
                     "of the window | requests |")
        lines.append("|---|---|---:|---:|---:|---|")
        for i in doc["idle"]:
            how = ("listen()" if i["mode"] == "listen" else "poll() loop")
            lines.append(f"| {i['lib']} | {how} | {i['seconds']:g} | "
                         f"{i['requests_per_interval']:.2f} | "
                         f"{_f(i.get('requests_per_interval_second_half'), 2)} | "
                         f"{_fmt_ops(i['requests'])} |")
    lines.append("")
    lines.append("Targets (issue 6):")
    lines.append("")
    lines.append("| target | measured | wanted | met | detail |")
    lines.append("|---|---:|---:|:---:|---|")
    for t in doc["targets"]:
        met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
        lines.append(f"| {t['target']} | {_f(t['value'], 2)} | {t['limit']} | {met} | "
                     f"{t['detail']} |")
    return ("\n".join(lines) + "\n" + packed_report.markdown(doc.get("packed") or {})
            + ops_markdown(doc.get("ops") or []))


def machine_md(m: dict[str, Any]) -> str:
    pq = m.get("pawn_queue", {})
    return "\n".join([
        f"- CPU: {m['nproc']} x {m['cpu_model']} (nproc {m['nproc']}); memory "
        f"{m['memory_gib']} GiB; {m['os']}",
        f"- Python {m['python']}; pawn-queue-sync {m['pawn_queue_sync']} with boto3 "
        f"{m['boto3']} / botocore {m['botocore']}",
        f"- pawn-queue {pq.get('pawn-queue', '?')} in its own venv: aioboto3 "
        f"{pq.get('aioboto3', '?')}, aiobotocore {pq.get('aiobotocore', '?')}, boto3 "
        f"{pq.get('boto3', '?')} / botocore {pq.get('botocore', '?')}",
        f"- Server: SeaweedFS {m['seaweedfs']} ({m['server']}), on the same machine",
        f"- Library sources: git {m.get('git_head', '?')} + "
        f"{m.get('core_uncommitted_files', '?')} uncommitted file(s) in pawn_queue_sync/; "
        f"fingerprint {m.get('core_fingerprint_start', '?')}"
        + ("" if m.get("core_fingerprint_end") in (None, m.get("core_fingerprint_start"))
           else f" -> {m['core_fingerprint_end']} (**the core changed during the run**)"),
        f"- Benchmark processes' niceness: {m.get('niceness', 0)} (the machine is shared "
        "with other work; load average counts all of it)",
        f"- Load average at start / end: "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_start'])} / "
        f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_end', ()))}; run took "
        f"{m.get('duration_s', '?')} s",
        *(f"- Merged in from a later run ({g['generated_at']}, steps {g['steps']}, backlogs "
          f"{g.get('backlogs')}): git {g.get('git_head', '?')}, fingerprint "
          f"{g.get('core_fingerprint', '?')}, load average "
          f"{', '.join(f'{x:.2f}' for x in g.get('loadavg_start') or ())} / "
          f"{', '.join(f'{x:.2f}' for x in g.get('loadavg_end') or ())}"
          for g in m.get("merged", [])),
    ])


HEADER = """# Performance: pawn-queue-sync against pawn-queue 0.1.3

Measured by `python -m benchmarks.run` (full run; `--quick` is a smoke run, `--endpoint`
uses an existing server). One run starts its own SeaweedFS on loopback and measures both
libraries against it with the same settings, each in subprocesses of its own (pawn-queue
0.1.3 in a venv of its own: it pins botocore 1.40.61). Every S3 request is counted with a
botocore `before-send.s3` hook in every process (error answers, marked `!`, with an
`after-call.s3` hook); client CPU is each process's user+system
time during the measured window; server CPU is the `weed` process's. Each message's
payload carries its publish time, and every acked message id is counted (duplicates,
losses). Raw numbers: `benchmarks/results/latest.json`.

How each library is driven:
- **pawn-queue** as its own docstring shows (`pawn_queue/core.py`):
  `await consumer.poll()`, then `await msg.ack()` for each message, in a tight loop (its
  own `listen()` sleeps `interval_seconds` after *every* poll, which would only make it
  slower); concurrent publishing is
  `asyncio.gather` over `producer.publish` (it has no batch call).
- **pawn-queue-sync**: `consumer.listen(handler, max_workers=N)` (thread pool, batched
  acks) and the pull loop `consumer.poll()` + `consumer.ack_many()`; `publish()` in a loop
  and `publish_batch(threads=16)`. The 3-process rows run one `listen()` per process,
  which is what each child of `WorkerPool` runs.
- Settings shared by both: `interval_seconds=0.2`, `visibility_timeout_seconds=30`, the
  same `max_messages_per_poll` per row, csprng_verify at both libraries' defaults
  (jitter 100-400 ms, 2 verify retries 150 ms apart).
- **Packed topics (issue 14)**, in the same run and on the same server
  (`--only packed,redis,spark` for these alone): 1 KiB payloads, a packed and a plain
  topic per step with the same settings (`benchmarks/packed.py`); redis-message-queue 11
  on a local `redis-server` as an anchor (`benchmarks/rmq.py`); Spark on `local[2]`
  (`benchmarks/spark_bench.py`, with `--spark` or in a full run). What bounds each
  figure: `python -m benchmarks.probe_packed SCENARIO --py-spy` (requests in flight,
  CPU, a py-spy profile of every thread).
"""


def write_doc(doc: dict[str, Any], path: Path) -> None:
    kept = ""
    if path.exists():
        old = path.read_text()
        if KEEP_MARKER in old:
            kept = old.split(KEEP_MARKER, 1)[1]
    run = "quick smoke run" if doc["quick"] else "full run"
    text = (
        HEADER
        + f"\n## Machine ({run}, {doc['generated_at']})\n\n"
        + machine_md(doc["machine"])
        + "\n\n## Results\n\n"
        + markdown(doc)
        + "\n" + KEEP_MARKER
        + (kept if kept else "\n")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.report [RESULTS.json] [--doc]``: print the tables of a
    results file again (and rewrite docs/performance.md from it)."""
    import argparse
    import json

    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("results", nargs="?", type=Path, default=here / "results" / "latest.json")
    p.add_argument("--doc", action="store_true", help="rewrite docs/performance.md")
    args = p.parse_args(argv)
    doc = json.loads(args.results.read_text())
    doc["targets"] = targets(doc)
    if doc.get("packed"):
        doc["packed"] = packed_report.build(doc["packed"]["rows"], None)
    print(markdown(doc))
    if args.doc:
        write_doc(doc, here.parent / "docs" / "performance.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
