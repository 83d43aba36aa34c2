"""Scenario 5: producers killed (kill -9) mid-publish_batch and mid-group-commit.

Producer processes (:mod:`benchmarks.chaos.producer`) publish as fast as they can:
publish_batch of 50-200 on a plain topic; on a packed one, publish() from 8 threads
(the batcher's group commit) plus a publish_batch thread (whole segments in
parallel). Each is killed a random 50-800 ms (quick: 20-400) after its first call,
and another starts, while the pool consumes throughout. A producer writes ``pubtry``
before each call and ``pub`` once it returns; the ids a kill caught in flight
(``pubtry`` alone) are recorded ``pubfail`` ("killed"), so the accounting counts those
that were delivered anyway as ``unconfirmed``. Goals: every ``pub`` id delivered (none lost),
the topic drains, and nothing half-written breaks a poll: no consumer logs an error
(the pool's log and the sweep's).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult
from benchmarks.chaos.ledger import expand
from benchmarks.chaos.programs import spawn, wait_for

NAME = "producer_kills"
NUMBER = 5
FULL_KILLS, QUICK_KILLS = 20, 4
#: Messages one producer process may try before it stops by itself, by topic kind (the
#: group commit of a packed topic publishes thousands a second: a kill must still find
#: it busy; the quick plain budget is about one batch, in flight when the kill comes).
FULL_BUDGET = {"plain": 1500, "packed": 20_000}
QUICK_BUDGET = {"plain": 80, "packed": 3000}
#: A kill comes this long (s, uniform) after the producer's first call (quick: sooner,
#: its budget is small).
KILL_AFTER, QUICK_KILL_AFTER = (0.05, 0.8), (0.02, 0.4)
#: Log lines of a consumer that say something broke (not a retried request).
_BROKEN = re.compile(r" ERROR |Traceback|SegmentError|quarantin", re.IGNORECASE)


def _producer_args(settings: ChaosSettings, budget: int, seed: int) -> list[str]:
    mode = (["--mode", "group", "--threads", "8", "--with-batch"] if settings.kind == "packed"
            else ["--mode", "batch", "--min", "50", "--max", "200"])
    return [*mode, "--budget", str(budget), "--seed", str(seed)]


def _outstanding(path: Path) -> set[str]:
    """Ids a producer's file shows tried and neither published nor failed."""
    tried: set[str] = set()
    done: set[str] = set()
    for ev in _events_of(path):
        if ev.get("e") == "pubtry":
            tried.update(ev.get("ids", ()))
        elif ev.get("e") in ("pub", "pubfail"):
            done.update(one["id"] for one in expand(ev))  # a pub line may carry ids
    return tried - done


def _events_of(path: Path) -> list[dict[str, Any]]:
    """One producer's events (its own file), a line cut short by the kill skipped."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # the line the kill cut short
    return out


class _Broken(logging.Handler):
    """Collects this process's consumer log records that say something broke."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = f" {record.levelname} {record.getMessage()}"
        if _BROKEN.search(text):
            self.lines.append(text.strip())


def run(settings: ChaosSettings) -> ScenarioResult:
    quick = settings.quick
    kills_wanted = QUICK_KILLS if quick else FULL_KILLS
    budget = settings.messages or (QUICK_BUDGET if quick else FULL_BUDGET)[settings.kind]
    rng = random.Random(settings.seed)
    kill_after = QUICK_KILL_AFTER if quick else KILL_AFTER
    broken = _Broken()
    logging.getLogger("pawn_queue_sync").addHandler(broken)
    try:
        with ChaosRun(settings) as chaos:
            chaos.queue()
            chaos.start_pool()
            mid_call = 0
            killed: set[str] = set()
            for k in range(kills_wanted):
                proc = spawn(chaos, "producer", "--topic", chaos.topic,
                             *_producer_args(settings, budget, settings.seed * 1000 + k))
                path = chaos.ledger.dir / f"producer-{proc.pid}.jsonl"
                wait_for(lambda p=path: p.exists() and b'"pubtry"' in p.read_bytes(), 60, proc)
                time.sleep(rng.uniform(*kill_after))  # the kill's moment: random on purpose
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                chaos.log.write("kill", pid=proc.pid)
                caught = _outstanding(path) if path.exists() else set()
                mid_call += bool(caught)
                killed |= caught
            for mid in sorted(killed):
                chaos.log.write("pubfail", id=mid, error="killed")
            ids = chaos.published_ids()
            handled = chaos.wait_handled(ids)
            result = chaos.finish(NAME, scenario=NUMBER, notes={})
            pool_lines = [line for log in sorted(chaos.run_dir.glob("pool-*.log"))
                          for line in log.read_text(errors="replace").splitlines()
                          if _BROKEN.search(line)]
    finally:
        logging.getLogger("pawn_queue_sync").removeHandler(broken)
    errors = pool_lines + broken.lines
    misses = list(result.misses)
    if errors:
        misses.append(f"{len(errors)} consumer log lines say a poll broke: {errors[:3]}")
    notes = {**result.notes, "producer_kills": kills_wanted, "kills_mid_call": mid_call,
             "killed_in_flight": len(killed), "handled_before_stop": handled,
             "consumer_errors": len(errors),
             "note_kills": f"{kills_wanted} producer kills ({mid_call} mid-call, "
                           f"{len(killed)} ids in flight); {len(errors)} consumer errors"}
    return ScenarioResult(
        scenario=result.scenario, name=result.name, kind=result.kind,
        strategy=result.strategy, counts=result.counts, notes=notes,
        goals_met=not misses, misses=misses,
    )
