"""Scenario 3: SeaweedFS stopped and started again mid-run (same ports, data directory
kept) while a producer process publishes and the pool consumes throughout.

A producer (:mod:`benchmarks.chaos.producer`, paced to last the run: publish_batch of
5-15 on a plain topic; publish() from 2 threads plus a publish_batch thread on a
packed one, the group commit) and the pool run from the start. Once the pool has
handled some messages the server goes down, stays down a few seconds (every request
fails meanwhile: publishes are recorded ``pubfail``, polls and acks fail and are
retried), and comes back on the same endpoint; after it has handled more, the next
restart, and after the last the producer stops. The full run restarts twice,
gracefully (SIGTERM; ``weed mini`` gets RestartableSeaweedFS's stop timeout before
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
#: Messages the pool handles before the first restart and between restarts.
PROGRESS = 30


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
    misses: list[str] = []
    restarts: list[dict[str, float | bool]] = []
    with ChaosRun(settings) as chaos:
        chaos.queue()  # the probe, before anything goes down
        chaos.start_pool()
        stop = chaos.run_dir / "producer.stop"
        producer = spawn(chaos, "producer", "--topic", chaos.topic,
                         *_producer_args(settings, n, stop))
        tail = LedgerTail(chaos.ledger.dir)
        handled: set[str] = set()

        def progressed(at_least: int) -> bool:
            handled.update(ev["id"] for ev in tail.new_events()
                           if ev.get("e") == "end" and ev.get("outcome") == "ok")
            return len(handled) >= at_least

        try:
            for graceful in _restarts(settings):
                target = len(handled) + PROGRESS
                if not wait_for(lambda t=target: progressed(t), 120):
                    misses.append(f"no progress before a restart ({len(handled)} handled)")
                t0 = time.monotonic()
                chaos.log.write("server_down", graceful=graceful)
                chaos.server.stop(graceful=graceful)
                time.sleep(down)  # the outage itself
                t1 = time.monotonic()
                chaos.server.start_again()
                chaos.log.write("server_up")
                restarts.append({"graceful": graceful, "stop_s": round(t1 - t0 - down, 1),
                                 "down_s": round(time.monotonic() - t0, 1)})
            target = len(handled) + PROGRESS
            if not wait_for(lambda t=target: progressed(t), 120):
                misses.append(f"no progress after the last restart ({len(handled)} handled)")
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
        handled_all = chaos.wait_handled(ids, timeout=max(120.0, 4 * settings.visibility_timeout
                                                          + 60))
        failed = sum(1 for ev in chaos.ledger.events() if ev.get("e") == "pubfail")
        said = ", ".join(f"{'graceful' if r['graceful'] else 'SIGKILL'} (down {r['down_s']} s)"
                         for r in restarts)
        return chaos.finish(NAME, scenario=NUMBER, extra_misses=misses, notes={
            "budget": n, "restarts": restarts, "handled_before_stop": handled_all,
            "pubfail": failed,
            "note_restarts": f"restarts: {said}; {failed} publishes failed while down",
        })
