"""Scenario 3: SeaweedFS stopped and started again mid-run (same ports, data directory
kept) while a producer process publishes and the pool consumes throughout.

A producer (:mod:`benchmarks.chaos.producer`, paced to last the run: publish_batch of
5-15 on a plain topic; publish() from 2 threads plus a publish_batch thread on a
packed one, the group commit) and the pool run from the start. Once the pool has
handled some messages the server goes down, stays down a few seconds (every request
fails meanwhile: publishes are recorded ``pubfail``, polls and acks fail and are
retried), and comes back on the same endpoint; after it has handled more, the next
restart, and after the last the producer stops. The full run restarts twice,
gracefully (SIGTERM; ``weed mini`` gets GRACEFUL_STOP_SECONDS to exit before
SIGKILL) then with SIGKILL; the quick run once, gracefully on plain topics and with
SIGKILL on packed ones. Everything published must be delivered and the topic must
drain.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult
from benchmarks.chaos.ledger import LedgerTail
from benchmarks.chaos.programs import spawn, wait_for

NAME = "restart"
NUMBER = 3
#: At most this many messages (the producer stops earlier, once the restarts are over).
FULL_MESSAGES, QUICK_MESSAGES = 5000, 1000
FULL_DOWN, QUICK_DOWN = 5.0, 2.0
#: How long a graceful stop waits for ``weed mini`` to exit after SIGTERM before SIGKILL
#: (it takes 10-20 s with its volumes; RestartableSeaweedFS's default is 10 s).
GRACEFUL_STOP_SECONDS = 30.0
#: Messages the pool handles (and, after the last restart, the producer publishes) before
#: the first restart, between restarts and after the last.
FULL_PROGRESS, QUICK_PROGRESS = 100, 30


def _restarts(settings: ChaosSettings) -> list[bool]:
    """``graceful`` of each restart."""
    if settings.quick:
        return [settings.kind == "plain"]
    return [True, False]


def _producer_args(settings: ChaosSettings, budget: int, stop: Path) -> list[str]:
    """Paced to last the whole run (it stops when ``stop`` exists)."""
    if settings.kind == "packed":  # ~8 publish()/s from 2 threads + ~80/s in batches
        mode = ["--mode", "group", "--threads", "2", "--with-batch", "--min", "10",
                "--max", "30", "--pause", "0.25"]
    else:  # ~20/s
        mode = ["--mode", "batch", "--min", "5", "--max", "15", "--pause", "0.5"]
    return [*mode, "--budget", str(budget), "--seed", str(settings.seed),
            "--stop-file", str(stop)]


def run(settings: ChaosSettings) -> ScenarioResult:
    n = settings.messages or (QUICK_MESSAGES if settings.quick else FULL_MESSAGES)
    down = QUICK_DOWN if settings.quick else FULL_DOWN
    step = QUICK_PROGRESS if settings.quick else FULL_PROGRESS
    misses: list[str] = []
    restarts: list[dict[str, float | bool]] = []
    with ChaosRun(settings) as chaos:
        chaos.queue()  # the probe, before anything goes down
        chaos.server.stop_timeout = GRACEFUL_STOP_SECONDS
        pool = chaos.start_pool()
        stop = chaos.run_dir / "producer.stop"
        producer = spawn(chaos, "producer", "--topic", chaos.topic,
                         *_producer_args(settings, n, stop))
        tail = LedgerTail(chaos.ledger.dir)
        handled: set[str] = set()
        published: set[str] = set()

        def progressed(at_least: int, published_too: int = 0) -> bool:
            """``at_least`` handled (and ``published_too`` published) so far."""
            for ev in tail.new_events():
                if ev.get("e") == "end" and ev.get("outcome") == "ok":
                    handled.add(ev["id"])
                elif ev.get("e") == "pub":
                    published.add(ev["id"])
            return len(handled) >= at_least and len(published) >= published_too

        try:
            for graceful in _restarts(settings):
                target = len(handled) + step
                if not wait_for(lambda t=target: progressed(t), 120):
                    misses.append(f"no progress before a restart ({len(handled)} handled)")
                t0 = time.monotonic()
                chaos.log.write("server_down", graceful=graceful)
                chaos.server.stop(graceful=graceful)
                stop_s = time.monotonic() - t0
                time.sleep(down)  # the outage itself
                chaos.server.start_again()
                chaos.log.write("server_up")
                restarts.append({
                    "graceful": graceful, "stop_s": round(stop_s, 1),
                    "sigkill_after_timeout": graceful and stop_s >= GRACEFUL_STOP_SECONDS,
                    "down_s": round(time.monotonic() - t0, 1)})
            # publishing and consuming both carry on after the last restart
            target, more = len(handled) + step, len(published) + step
            if not wait_for(lambda t=target, p=more: progressed(t, p), 120):
                misses.append(f"no progress after the last restart ({len(handled)} handled, "
                              f"{len(published)} published)")
            stop.touch()
            try:
                code = producer.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = None
                misses.append("the producer did not finish its budget in time")
            if code not in (0, None):
                misses.append(f"the producer exited with {code} (see producer-0.log)")
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        ids = chaos.published_ids()
        if not pool.alive():  # it gave up during an outage (fixed: workers.pool, RET_CONNECT)
            misses.append(f"the worker pool exited during the run (status {pool.proc.poll()})")
        restarted = sum(line.count("died unexpectedly")
                        for log in chaos.run_dir.glob("pool-*.log")
                        for line in log.read_text(errors="replace").splitlines())
        handled_all = chaos.wait_handled(ids)
        failed = sum(1 for ev in chaos.ledger.events() if ev.get("e") == "pubfail")
        said = ", ".join(_said(r) for r in restarts)
        return chaos.finish(NAME, scenario=NUMBER, extra_misses=misses, notes={
            "budget": n, "restarts": restarts, "handled_before_stop": handled_all,
            "pool_child_restarts": restarted,
            "pubfail": failed,
            "note_restarts": f"restarts: {said}; {failed} publishes failed while down",
        })


def _said(restart: dict[str, float | bool]) -> str:
    """One restart in the table's notes."""
    if not restart["graceful"]:
        how = "SIGKILL"
    elif restart["sigkill_after_timeout"]:
        how = f"SIGTERM, SIGKILL after {GRACEFUL_STOP_SECONDS:g} s"
    else:
        how = f"graceful, stopped in {restart['stop_s']} s"
    return f"{how} (down {restart['down_s']} s)"
