"""Scenario 2: kill -9 of a random worker process every few seconds, handlers mid-flight.

The pool (3 processes x 8 threads) restarts each killed child; handlers work up to
200 ms, so every kill catches some mid-flight. More messages are published whenever
the backlog runs low, so the pool is busy until the last kill (at least 20 in the full
run). The killed children's leases go stale and other workers take their messages.
"""

from __future__ import annotations

import random
import time

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult
from benchmarks.chaos.ledger import LedgerTail

NAME = "kills"
NUMBER = 2
FULL_KILLS, QUICK_KILLS = 20, 3
FULL_MESSAGES, QUICK_MESSAGES = 1500, 150
FULL_INTERVAL, QUICK_INTERVAL = 3.0, 2.0
WORK_MS = 200
#: Publish more when fewer than this many published messages await a handler.
LOW_BACKLOG = 100


def run(settings: ChaosSettings) -> ScenarioResult:
    quick = settings.quick
    kills_wanted = QUICK_KILLS if quick else FULL_KILLS
    interval = QUICK_INTERVAL if quick else FULL_INTERVAL
    batch = settings.messages or (QUICK_MESSAGES if quick else FULL_MESSAGES)
    rng = random.Random(settings.seed)
    with ChaosRun(settings) as chaos:
        pool = chaos.start_pool(env={"CHAOS_WORK_MS": str(WORK_MS)})
        published = set(chaos.publish(batch))
        handled: set[str] = set()
        tail = LedgerTail(chaos.ledger.dir)
        missed = 0  # kill attempts that found no child (all restarting)
        while pool.kills < kills_wanted and missed < 50:
            time.sleep(interval * rng.uniform(0.5, 1.5))
            handled.update(ev["id"] for ev in tail.new_events()
                           if ev.get("e") == "end" and ev.get("outcome") == "ok")
            if len(published - handled) < LOW_BACKLOG:
                published.update(chaos.publish(batch))
            if pool.kill_child(rng) is None:
                missed += 1
        ids = chaos.published_ids(published)
        done = chaos.wait_handled(ids, timeout=max(120.0, 4 * settings.visibility_timeout + 60))
        return chaos.finish(NAME, scenario=NUMBER, notes={
            "messages": len(published), "handled_before_stop": done,
            "kill_interval_s": interval, "work_ms": WORK_MS,
        })
