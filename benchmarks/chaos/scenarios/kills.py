"""Scenario 2: kill -9 of a random worker process every few seconds, handlers mid-flight.

The pool (3 processes x 8 threads) restarts each killed child; handlers work up to
1 s, and each kill picks among the children with a handler running as far as the
ledger shows (a start and no end yet; not a child still starting up after a restart,
nor one between two polls), so a kill catches most mid-flight. More messages
are published whenever the backlog runs low, so the pool is busy until the last kill
(at least 20 in the full run). The killed children's leases go stale and other
workers take their messages. A goal of its own: at least half the kills (one in the
quick run) left a delivery started and never ended in the killed process; the notes
say how many did.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult
from benchmarks.chaos.ledger import LedgerTail

NAME = "kills"
NUMBER = 2
FULL_KILLS, QUICK_KILLS = 20, 3
FULL_MESSAGES, QUICK_MESSAGES = 1500, 150
FULL_INTERVAL, QUICK_INTERVAL = 3.0, 2.0
WORK_MS = 1000
#: Publish more when fewer than this many published messages await a handler.
LOW_BACKLOG = 100


def kills_mid_flight(events: Iterable[dict[str, Any]]) -> int:
    """How many ``kill`` events' pids have a ``start`` with no ``end`` of that id in that
    pid: kills that interrupted a handler."""
    open_deliveries: Counter[tuple[int, str]] = Counter()
    killed: set[int] = set()
    for ev in events:
        e = ev.get("e")
        if e == "start":
            open_deliveries[(ev["pid"], ev["id"])] += 1
        elif e == "end":
            open_deliveries[(ev["pid"], ev["id"])] -= 1
        elif e == "kill":
            killed.add(ev["pid"])
    interrupted = {pid for (pid, _), n in open_deliveries.items() if n > 0}
    return len(killed & interrupted)


def mid_flight_miss(caught: int, kills: int, *, quick: bool) -> list[str]:
    """The misses when the run made fewer kills than it asks for (QUICK_KILLS or
    FULL_KILLS: its kill attempts kept finding no child at work), or too few of them
    caught a handler mid-flight (half; one when quick): the scenario would not test
    what it says."""
    misses = []
    asked = QUICK_KILLS if quick else FULL_KILLS
    if kills < asked:
        misses.append(f"only {kills} kills made (wanted {asked})")
    wanted = 1 if quick else max(1, (kills + 1) // 2)
    if caught < wanted:
        misses.append(f"only {caught} of {kills} kills interrupted a handler (wanted {wanted})")
    return misses


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
        running: Counter[int] = Counter()  # pid -> its handlers started and not ended
        missed = 0  # kill attempts that found no child with a handler running
        while pool.kills < kills_wanted and missed < 50:
            time.sleep(interval * rng.uniform(0.5, 1.5))
            for ev in tail.new_events():
                if ev.get("e") == "start":
                    running[ev["pid"]] += 1
                elif ev.get("e") == "end":
                    running[ev["pid"]] -= 1
                    if ev.get("outcome") == "ok":
                        handled.add(ev["id"])
            if len(published - handled) < LOW_BACKLOG:
                published.update(chaos.publish(batch))
            working = {pid for pid, n in running.items() if n > 0}
            if pool.kill_child(rng, among=working) is None:
                missed += 1
        ids = chaos.published_ids(published)
        done = chaos.wait_handled(ids)
        caught = kills_mid_flight(chaos.ledger.events())
        return chaos.finish(NAME, scenario=NUMBER, notes={
            "messages": len(published), "handled_before_stop": done,
            "kill_interval_s": interval, "work_ms": WORK_MS, "kills_mid_flight": caught,
            "kill_attempts_missed": missed,
        }, extra_misses=mid_flight_miss(caught, pool.kills, quick=quick))
